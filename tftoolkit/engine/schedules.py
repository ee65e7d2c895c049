"""Learning-rate schedule: warmup from the base LR to the batch-scaled LR, then constant / cosine / step decay.

The rule that scales the peak LR with the global batch lives in ``RunConfig.learning_rate``; this module
only shapes it over time. One implementation serves training (a Keras schedule evaluated inside the
tf.function) and reporting (``lr_at`` evaluates the same object on the host).
"""

from __future__ import annotations

import keras
from keras import ops

# Step decay: multiply by 0.1 at these fractions of the post-warmup steps (the CIFAR/ImageNet recipe
# of Goyal et al. drops at 1/3, 2/3 and 8/9 of training; two drops fit short runs better).
STEP_MILESTONES = (0.5, 0.75)
STEP_FACTOR = 0.1


@keras.saving.register_keras_serializable("tftoolkit")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup over ``warmup_steps`` from ``start_lr`` to ``peak_lr``, then ``decay`` to the end.

    Goyal et al. (2017) warm up from the LR tuned for the small batch (``start_lr`` = base LR) to the
    linearly scaled LR, because the scaled LR is too large for the first steps of a fresh network.
    """

    def __init__(self, peak_lr: float, start_lr: float, warmup_steps: int, total_steps: int, decay: str = "constant"):
        if decay not in ("constant", "cosine", "step"):
            raise ValueError(f"unknown decay {decay!r}")
        self.peak_lr = float(peak_lr)
        self.start_lr = float(start_lr)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = float(max(self.warmup_steps, 0))
        # Warmup: the LR used at step s (0-based) is start + (peak - start) * s / warm, reaching peak at s = warm.
        frac = ops.clip(step / max(warm, 1.0), 0.0, 1.0)
        warm_lr = self.start_lr + (self.peak_lr - self.start_lr) * frac
        decay_len = float(max(self.total_steps - self.warmup_steps, 1))
        progress = ops.clip((step - warm) / decay_len, 0.0, 1.0)
        if self.decay == "constant":
            after = ops.convert_to_tensor(self.peak_lr, "float32")
        elif self.decay == "cosine":
            after = 0.5 * self.peak_lr * (1.0 + ops.cos(3.141592653589793 * progress))
        else:
            drops = sum(ops.cast(progress >= m, "float32") for m in STEP_MILESTONES)
            after = self.peak_lr * ops.power(STEP_FACTOR, drops)
        return ops.where(step < warm, warm_lr, after)

    def get_config(self):
        return {"peak_lr": self.peak_lr, "start_lr": self.start_lr, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "decay": self.decay}


def from_config(config, train_examples: int) -> WarmupSchedule:
    return WarmupSchedule(
        peak_lr=config.learning_rate,
        start_lr=min(config.base_lr, config.learning_rate),
        warmup_steps=config.warmup_steps(train_examples),
        total_steps=config.total_steps(train_examples),
        decay=config.schedule,
    )


def lr_at(schedule: WarmupSchedule, step: int) -> float:
    return float(ops.convert_to_numpy(schedule(step)))
