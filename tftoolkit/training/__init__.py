"""A training run: the engine, measured, with its run directory (single process or one worker of many).

    api   ``train(config, out)``: the public entry; resolves the cluster, sets up the session, runs
    run   ``Run``: the host side of the loop (timing, evaluation, checkpoints, divergence)
    records   what a run writes: files (steps.csv, evals.csv, env.json) and summary (summary.json's fields and
              the last log line), for both kinds of run
    recorder        ``RunRecorder``: a user's model.fit into a run directory (keras_facts: what Keras says)
    tensorboard     events and the profiler
"""

from .api import train

__all__ = ["train"]
