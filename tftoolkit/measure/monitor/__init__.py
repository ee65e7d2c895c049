"""The hardware monitor: a background sampler writing a tidy ``monitor.csv`` next to a run, and its analysis.

    with sampler.Monitor(run_dir / "monitor.csv", interval_s=0.5) as mon:
        mon.phase("warmup"); ...
        mon.phase("train"); ...
    df = analysis.read_monitor(run_dir)
    summary = analysis.summarize(df, images=n_images, phase="train")

    metrics    the file's columns and every metric with its unit (the one place they are listed)
    sampler    ``Monitor``: GPU (NVML) and host (psutil) readings every interval, in a daemon thread
    cpu_times  CPU utilisation from psutil's cumulative CPU times (the sampler's host and per-core rows)
    analysis   ``read_monitor`` and ``summarize``: per-GPU utilisation, memory, energy, idle and throttle flags

None of them imports TensorFlow: monitor.csv copied off a GPU server is read and summarised on a laptop.
"""
