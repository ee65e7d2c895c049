"""Engine: how a data-parallel step runs, and nothing about files or measurement.

    devices      real GPUs, or N logical CPU devices simulating N replicas (before TensorFlow initialises)
    strategy     the one place a tf.distribute strategy is created
    session      the set-up every entry point shares: resolve -> devices -> data -> global settings -> strategy
    models       the model registry;  schedules  warmup + decay;  optimizers  the optimiser a config names
    feed         where the training split lives (host or device placement) and how a replica gets its batch
    step         the compiled training step and loop (loss / global batch, explicit gradient all-reduce)
    noise        the gradient noise scale, computed inside the step from what data parallelism already has
    loop         the chunked driver: epochs and positions -> calls of the compiled loop, with small hooks
    checkpoint   save and restore through tf.train.CheckpointManager (one copy kept in multi-worker runs)
"""
