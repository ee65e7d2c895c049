"""Measurement: what a run's numbers mean, and the parts of the system measured alone.

    stats        images/sec with its standard error, jitter, speedup, efficiency (the formulas)
    breakdown    where a step's time goes: compute, gradient all-reduce, input wait; load balance
    flops        FLOPs per example, achieved FLOP/s, peak and MFU
    allreduce    all-reduce time and bus bandwidth per implementation and size (nccl-tests' definitions)
    inputbench   the input pipeline alone, cold and cached
    hardware     host, TensorFlow build, GPUs and their interconnect (NVML; no TensorFlow import)
    monitor      the background sampler behind monitor.csv, and its analysis (no TensorFlow import)
"""
