"""The input pipeline measured alone, and what its capacity says about a run.

    bench     how fast engine.feed + data.pipeline deliver images through the strategy, no model (``tftoolkit bench
              input``), and the capacity probe every run carries
    verdict   input-bound, close to the limit, or fed: a pure function of the capacity and the rate trained (no
              TensorFlow)

Where a host's input becomes the limit at more GPUs is the planner's (planner/inputlimit.py).
"""
