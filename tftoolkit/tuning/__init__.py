"""Tuning: the batch, the learning rate and the GPU count of a training.

    finders       LR range test and the largest per-replica batch that fits, under the strategy (trains)
    advise        a recommended global batch and GPU count from a run's gradient noise scale (reads files)
    advice_text   what advise found, in words
    timetoloss    time to the same loss on N GPUs over a link (the planner's forecast with the noise scale)
"""
