"""Data: sources of examples, and the tf.data pipeline that turns them into per-replica batches.

    source     DataSource, NumPy arrays, the synthetic set
    store      a split held for random access (arrays; files read into memory once)
    catalog    what ``config.dataset`` names: synthetic, shapes16k, a folder of images, TFRecord shards
    pipeline   per-epoch seeded index orders, cut per replica, gathered a whole batch at a time
    shapes     the shapes16k generator;  tfrecords  shards + manifest;  folders  class sub-folders
    home       where named datasets are kept

Nothing here creates a strategy or a model: the pipeline takes the strategy it distributes over.
"""
