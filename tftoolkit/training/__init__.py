"""A training run: the engine, measured, with its run directory (single process or one worker of many).

    api   ``train(config, out)``: the public entry; resolves the cluster, sets up the session, runs
    run   ``Run``: the host side of the loop (timing, logs, checkpoints, monitor, summary)
"""

from .api import train

__all__ = ["train"]
