"""Measurement: what a run's numbers mean, and the parts of the system measured alone.

    stats              images/sec with its standard error, jitter, speedup, efficiency (the formulas)
    scaling            speed-up and efficiency within each group of runs that differ only in replica count
    breakdown          where a step's time goes: compute, gradient all-reduce, input wait; load balance
    flops              FLOPs per example, achieved FLOP/s, peak and MFU
    peaks              rated peak dense FLOP/s of a GPU by its NVML name (figures from tftoolkit/catalogue)
    allreduce/         all-reduce definitions (nccl-tests'), size parsing, strategies and timing (the package);
                       bench: the allreduce.csv benchmark, every implementation and dtype over a size sweep
    input/             the input pipeline alone, cold and cached (bench), and what a run's input capacity says of
                       it: input-bound, close to the limit, or fed (verdict)
    hardware           the environment report: host, TensorFlow build, GPUs, data home, Slurm (no TensorFlow import)
    host_topology      this host's GPUs as NVML sees them and how they are wired (NVLink, PCIe; nvidia-smi topo -m as the fallback)
    monitor/           the background sampler behind monitor.csv (sampler), its columns (metrics), its analysis
    doctor/            ``tftoolkit doctor``: the registry of checks and their report (the package); the checks in
                       tensorflow_checks and driver_checks (NVML, NCCL), their result type in check

NVML is opened through ``tftoolkit.nvml.session`` only.
"""
