"""The named choices and defaults the planner and tuning commands offer, in one light module (no NumPy, no pandas).

The modules that use them (forecast, calibration, planner, finders) import them from here, and so does the CLI,
whose --help lists them without importing the planner or the finders.
"""

from __future__ import annotations

# The planner.
DEVICES = ("dedicated", "shared")  # a run's replicas on GPUs of their own, or simulated ones sharing host cores
DEFAULT_GPUS_PER_HOST = 8
ALGORITHMS = ("ring", "tree", "ring-in-order", "star", "hierarchical-copy", "host", "parameter-server")
DEFAULT_ALGORITHM = "ring"  # this toolkit's own step: MirroredStrategy's NCCL all-reduce, a ring over the topology

# LR finder defaults: 1e-6..10 spans every optimiser's useful range; 200 steps keep the sweep to a few hundred
# steps while giving ~29 steps per decade.
LR_MIN, LR_MAX, LR_STEPS = 1e-6, 10.0, 200
BLOWUP = 4.0  # stop when the smoothed loss exceeds this multiple of its minimum
MAX_BATCH = 2**16  # find-batch stops doubling here
