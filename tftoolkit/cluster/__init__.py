"""More than one process or host: which cluster a process is in, how workers join it, a local launcher.

    spec      the cluster TF_CONFIG or a Slurm step describes (checked, with messages saying what is wrong)
    workers   a worker's way in: join, agree on the config, markers for the launcher
    launch    K worker processes on this machine (tftoolkit launch), stopped together

The training run itself is tftoolkit.training's; this package never trains.
"""
