"""Data: sources of examples, and the tf.data pipeline that turns them into per-replica batches.

    source     DataSource, NumPy arrays, the synthetic set
    store      a split held for random access (arrays; files read into memory once)
    registry   what ``config.dataset`` names: synthetic, shapes16k, a folder of images, TFRecord shards
    pipeline   per-epoch seeded index orders, cut per replica, gathered a whole batch at a time
    file_source  a source over files: decoded into memory when it fits, else streamed
    stream     a split read from its files while it trains;  decode  its transforms;  bad_records  what fails
    shapes     the shapes16k generator;  tfrecords  shards;  manifest  their manifest.json and its check
    folders    class sub-folders;  imagenet, tfds_dir, cifar, keras_sets  the other layouts
    home       where named datasets are kept

Nothing here creates a strategy or a model: the pipeline takes the strategy it distributes over.
"""
