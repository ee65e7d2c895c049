"""The headed groups RunConfig's options are listed under in ``--help`` and in the reference pages.

Every option RunConfig generates belongs to exactly one section (tests/test_config.py checks it); a command's own
options that belong with them (train's --out and --force with the checkpoints) join the same group.
"""

from __future__ import annotations

SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("devices", ("replicas", "gpus", "workers", "cross_device_ops", "allreduce_dtype", "allreduce_packs")),
    ("batch and learning rate", ("per_replica_batch", "global_batch", "accumulate", "base_lr", "base_batch", "lr_rule",
                                 "warmup_epochs", "schedule", "optimizer", "weight_decay")),
    ("length and evaluation", ("epochs", "steps", "eval_every_epoch", "divergence_factor")),
    ("model and task", ("model", "loss", "metrics", "num_classes")),
    ("data", ("dataset", "train_images", "image_size", "augment", "imagenet_labels", "skip_bad_images", "verify",
              "input_sharding", "data_memory_gb", "data_placement", "last_batch")),
    ("tf.data service", ("data_service", "data_service_timeout")),
    ("numerics and speed", ("precision", "jit", "steps_per_loop", "seed", "deterministic")),
    ("measurement", ("measure", "measure_budget", "timing_warmup_steps", "noise_scale", "profile_steps")),
    ("checkpoints and output", ("checkpoint_every",)),
)

OUTPUT = "checkpoints and output"  # where a command's --out, --force and --quiet go


def section_of(name: str) -> str:
    """The section a RunConfig field's option is listed under."""
    for title, names in SECTIONS:
        if name in names:
            return title
    raise KeyError(f"{name} is in no section of tftoolkit/cli/sections.py: add it to one")
