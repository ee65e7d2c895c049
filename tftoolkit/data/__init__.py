"""Data: sources of examples, and the tf.data pipeline that turns them into per-replica batches.

    source     DataSource, NumPy arrays, the synthetic set
    catalog    what ``config.dataset`` names: synthetic, shapes16k, a folder of images, TFRecord shards
    pipeline   one epoch of global batches (seeded shuffle), split into per-replica slices
    shapes     the shapes16k generator;  tfrecords  shards + manifest;  folders  class sub-folders
    home       where named datasets are kept

Nothing here creates a strategy or a model: the pipeline takes the strategy it distributes over.
"""
