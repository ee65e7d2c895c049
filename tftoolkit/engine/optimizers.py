"""The optimiser a config names, wired so that the training step's own gradient all-reduce is the only one."""

from __future__ import annotations

import logging

import keras

log = logging.getLogger("tftoolkit")


def make_optimizer(config, schedule):
    wd = config.weight_decay or None
    name = config.optimizer
    if name == "sgd":
        opt = keras.optimizers.SGD(schedule, weight_decay=wd)
    elif name == "momentum":
        opt = keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=wd)
    elif name == "adam":
        opt = keras.optimizers.Adam(schedule, weight_decay=wd)
    elif name == "adamw":
        opt = keras.optimizers.AdamW(schedule, weight_decay=config.weight_decay)
    else:
        opt = keras.optimizers.Lamb(schedule, weight_decay=wd)
    if config.precision == "mixed_float16" or (config.allreduce_dtype == "float16" and (config.replicas or 1) > 1):
        # float16 gradients underflow without loss scaling; the wrapper also skips steps with inf/nan grads. A
        # float16 all-reduce of float32 gradients needs the same: a gradient divided by the global batch is often
        # below float16's smallest normal (6e-5) and would arrive as 0 (engine/collectives.py: where the scale sits).
        if config.precision != "mixed_float16":
            log.info("--allreduce-dtype float16: dynamic loss scaling turned on (gradients travel multiplied by the "
                     "loss scale, so they stay within float16's range; a step whose sum overflows is skipped and the "
                     "scale lowered)")
        opt = keras.optimizers.LossScaleOptimizer(opt)
    # The training step all-reduces the gradients itself (so it can be timed and the per-replica gradients
    # seen); Keras would all-reduce them a second time inside apply(), summing N copies. Turn that off.
    inner = getattr(opt, "inner_optimizer", opt)
    inner._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
    return opt
