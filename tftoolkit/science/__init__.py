"""Batch-size science and the planner: the batch, the learning rate and the GPU count, and which server to get.

    finders   LR range test and the largest per-replica batch that fits, under the strategy (trains)
    advise    a recommended global batch and GPU count from a run's gradient noise scale (reads files)
    predict   the scaling model: speedup and efficiency for hardware you do not have (reads files)
"""
