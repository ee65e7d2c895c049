"""RunConfig: every parameter of a training run, validated once, with every derived number computed here.

The config is a frozen dataclass of papermill-safe primitives (int, float, str, bool, None, lists of int),
so the same object comes from CLI flags, a papermill parameters cell, a sweep YAML or a Python dict. The rules
its values must meet (types, ranges, choices, fields that must agree) are in config/rules.py.
The CLI's train options are generated from the field metadata below, so ``--help`` and this file cannot
drift apart.

Data-parallel arithmetic lives in the properties at the bottom: global batch, per-replica batch, the
scaled learning rate and steps per epoch. Nothing else in the package recomputes them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from . import rules
from .rules import whole_number

LR_RULES = ("none", "linear", "sqrt")
SCHEDULES = ("constant", "cosine", "step")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "lamb")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one", "collective")
LAST_BATCH = ("drop", "partial")
ALLREDUCE_DTYPES = ("float32", "bfloat16", "float16")
VERIFY_MODES = ("full", "cached", "off")  # how TFRecord shards are checked before use (--verify)
SCALING_MODES = ("weak", "strong")  # weak keeps the per-replica batch as replicas grow, strong the global batch
DEFAULT_MAX_REPLICAS = 64  # the most GPUs advise and predict consider unless told
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # bytes per gradient element in each all-reduce dtype
DEFAULT_PER_REPLICA_BATCH = 64  # when neither --per-replica-batch nor --global-batch is given


def _f(default, help, choices=None, cli=True, identity=True):
    """A config field with its --help text (and allowed values) attached. ``identity=False``: the field says how a
    run is executed or reported, not what it computes, so changing it does not make a run directory hold a
    different run (a rerun resumes it; see NON_IDENTITY_KEYS)."""
    return field(default=default, metadata={"help": help, "choices": choices, "cli": cli, "identity": identity})


@dataclass(frozen=True)
class RunConfig:
    # --- devices -------------------------------------------------------------------------------
    replicas: int | None = _f(None, "number of replicas: the first N GPUs, or N simulated CPU devices where "
                                    "there is no GPU, at most 64 (default: all GPUs, or 1 on CPU)")
    gpus: list[int] | None = _f(None, "GPU indices to use, e.g. 0,2,5 (sets replicas to their count)")
    workers: int = _f(1, "worker processes (hosts) sharing the replicas; --replicas then counts all workers' "
                         "replicas. > 1 trains with MultiWorkerMirroredStrategy on the cluster TF_CONFIG or Slurm "
                         "describes, or starts the workers on this machine (like tftoolkit launch)", identity=False)
    cross_device_ops: str = _f("auto", "gradient all-reduce implementation; auto = NCCL on multi-GPU Linux, "
                                       "reduce_to_one on CPU replicas; collective = MirroredStrategy's own "
                                       "CollectiveAllReduce (ring on CPU, NCCL on GPUs: what multi-worker runs and "
                                       "XLA use); hierarchical_copy needs an even replica count", CROSS_DEVICE_OPS)
    allreduce_dtype: str = _f("float32", "dtype the gradients travel in through the all-reduce: cast before it, back "
                                         "to float32 after (bfloat16/float16 move half the bytes; float16 needs a loss "
                                         "scale, turned on with it when --precision does not bring one)",
                              ALLREDUCE_DTYPES)
    allreduce_packs: int = _f(1, "all-reduce the gradients in this many packs of about equal bytes, last layers "
                                 "first, each its own collective: a pack whose gradients are ready can go while the "
                                 "backward pass computes the rest (DDP's buckets; engine/collectives.py). The same sums: a run may resume with "
                                 "another value", identity=False)
    # --- batch and learning rate ----------------------------------------------------------------
    # The default recipe, tuned on shapes16k so that the README's first command learns (>= 0.80 validation
    # accuracy after 5 epochs, at 4 x 100 and at 1 x 128; BENCHMARKS.md): small_vgg with Adam at 4e-3 for a
    # global batch of 256, scaled by the square-root rule (Adam's: its steps are normalised, so linear scaling
    # overshoots; Hoffer et al. 2017, Malladi et al. 2022), one epoch of warmup and cosine decay. Momentum SGD,
    # the toolkit's former default, stays near chance on small_vgg (0.19 after 5 epochs at 4 x 100: with no
    # normalisation layer to condition it, it plateaus); it remains one flag away, and the batch-size study
    # (sweeps/batch_lr.yaml) uses it on small_cnn_bn, whose batch norm it needs, as Goyal et al. did.
    per_replica_batch: int | None = _f(None, f"examples per replica per forward/backward pass; global batch = this x replicas "
                                             f"(default: {DEFAULT_PER_REPLICA_BATCH}, or --global-batch / (replicas x --accumulate); "
                                             "given with --global-batch, the two must agree)")
    global_batch: int | None = _f(None, "global batch instead of --per-replica-batch; must divide by replicas "
                                        "(x --accumulate)")
    accumulate: int = _f(1, "micro-batches of --per-replica-batch each replica runs per optimizer step, summing their "
                            "gradients before one all-reduce: global batch = per-replica batch x replicas x this, a "
                            "batch larger than the devices hold (gradient accumulation)")
    base_lr: float = _f(0.004, "learning rate at --base-batch; the LR rule scales it to the global batch")
    base_batch: int = _f(256, "global batch at which --base-lr was tuned")
    lr_rule: str = _f("sqrt", "how the LR scales with global batch: linear (Goyal et al. 2017, for SGD), "
                              "sqrt (usual for Adam-type optimisers) or none", LR_RULES)
    warmup_epochs: float = _f(1.0, "epochs of linear warmup from --base-lr to the scaled LR")
    schedule: str = _f("cosine", "decay after warmup", SCHEDULES)
    optimizer: str = _f("adam", "optimiser (momentum = SGD with Nesterov-free momentum 0.9)", OPTIMIZERS)
    weight_decay: float = _f(0.0, "decoupled weight decay passed to the optimiser (0 = off)")
    # --- length ---------------------------------------------------------------------------------
    epochs: float = _f(1.0, "epochs to train (fractions allowed)")
    steps: int | None = _f(None, "optimizer steps to train; overrides --epochs")
    # --- model and data -------------------------------------------------------------------------
    model: str = _f("small_vgg", "registered model name (small_vgg, small_cnn, resnet20, resnet50, mobilenet_v2, ...) "
                                 "or an import path package.module:function returning a Keras model")
    dataset: str = _f("shapes16k", "shapes16k (generated on first use), synthetic (random tensors in memory: no I/O), "
                                   "cifar10, cifar100, mnist or fashion_mnist (keras.datasets: downloaded once into "
                                   "Keras' cache), or PATH: ImageNet-layout TFRecords (train-00000-of-01024 ...), a "
                                   "TFDS-prepared directory, CIFAR's python folder (cifar-10-batches-py), a folder of "
                                   "class sub-folders of images, or TFRecords with a manifest.json (docs/guides/data.md)")
    train_images: int | None = _f(None, "use only the first N training images (default: all)")
    image_size: int | None = _f(None, "image side in pixels that images are decoded or resized to (default: the "
                                      "dataset's own where its images share one size: 32 for synthetic, shapes16k and "
                                      "CIFAR, 28 for MNIST; for images of mixed sizes the median shorter side of a "
                                      "sample, at most 224 (ImageNet's); the log says which)")
    num_classes: int | None = _f(None, "classes: of synthetic data (default 10); every other dataset's count is taken "
                                       "from the data (its labels, class folders or manifest), and recorded here")
    augment: bool = _f(False, "augment training images: random flip and pad-and-crop for images held in memory and "
                              "for streamed images of one size; Inception-style random crops (8-100% of the area, "
                              "aspect 3/4-4/3) and flips for streamed images of mixed sizes")
    imagenet_labels: str = _f("shift", "ImageNet-layout TFRecords store labels 1..1000 (0 is the background class "
                                       "build_imagenet_data.py reserves): shift them to 0..999 (1000 outputs) or keep "
                                       "them (1001 outputs, output 0 never a target, as TF-slim and tf_cnn_benchmarks "
                                       "do); labels that start at 0 are read as they are", ("shift", "keep"))
    skip_bad_images: bool = _f(False, "skip images that do not decode (and records that do not parse, or whose label "
                                      "is out of range): count them and name the first few in summary.json "
                                      "(skipped_images); without it the first one stops the run, naming its file and "
                                      "record. A run stopped so resumes with it", identity=False)
    verify: str = _f("cached", "check TFRecord shards before use: full (framing, record counts and sha256 of every "
                     "shard), cached (the same, skipping shards whose size and mtime match their last passed check, "
                     "recorded in verified.json beside the manifest), off (only that the shards exist)",
                     VERIFY_MODES, identity=False)
    input_sharding: str = _f("exact", "what each worker of a multi-worker run reads: exact (every worker computes every "
                             "global batch's order and gathers its replicas' slices: bit-equal to one process), "
                             "file (each worker reads only its own TFRecord shards, as TensorFlow's "
                             "AutoShardPolicy.FILE: input cost no longer grows with the workers, but the batches "
                             "differ from one process's; needs at least one shard per worker)", ("exact", "file"))
    data_memory_gb: float | None = _f(None, "decode a dataset of image files into memory only when its pixels take "
                                      "at most this many GB at --image-size (default: a quarter of the RAM "
                                      "available); a larger one streams from its files, read and decoded by tf.data "
                                      "as it trains (data/stream.py)")
    data_placement: str = _f("auto", "where the training split lives while training: host (tf.data gathers each "
                             "replica's batch on the CPU), device (one uint8 copy on every replica's device, "
                             "batches gathered there: only indices cross from the host), auto (device on GPUs when "
                             "the split takes at most a quarter of each GPU's memory, by NVML; host otherwise and on "
                             "CPU). Same examples, same results in every placement", ("host", "device", "auto"), identity=False)
    loss: str | None = _f(None, "the training loss, a name Keras knows (mse, mae, binary_crossentropy, huber, ...); "
                                "default: sparse categorical cross-entropy on logits (image classification), or the "
                                "loss the model was compiled with. One value per example, averaged over pixels or "
                                "tokens as Keras' own reduction does (engine/losses.py)")
    metrics: str | None = _f(None, "metrics to evaluate, comma-separated Keras names (mae,auc,...); each is reported "
                                   "as val_<name> (classification reports val_accuracy without asking)")
    data_service: str | None = _f(None, "HOST:PORT of a tf.data service dispatcher (tftoolkit data-service start): "
                                        "the training input pipeline runs on its workers, which read the same files "
                                        "(same paths) and stream each step's batches here; validation stays local. "
                                        "One service worker keeps the exact order; K > 1 hand out whole epochs, so K "
                                        "epochs' steps interleave (data/service.py)", identity=False)
    data_service_timeout: float = _f(300.0, "with --data-service: seconds the service may deliver no step's batch "
                                            "while training waits before the run ends as failed, checkpoints kept "
                                            "(TensorFlow's client would wait forever for a dead worker or "
                                            "dispatcher); long enough for a worker or a --work-dir dispatcher to be "
                                            "started again, and longer than one step and the first call's tracing",
                                     identity=False)
    last_batch: str = _f("drop", "a final batch smaller than the global batch: drop it (count reported) or "
                                 "train on it split evenly across replicas", LAST_BATCH)
    # --- numerics and speed ---------------------------------------------------------------------
    precision: str = _f("float32", "float32, or mixed precision (float16 uses dynamic loss scaling)", PRECISIONS)
    jit: bool = _f(False, "compile the training step with XLA")
    steps_per_loop: int = _f(10, "training steps per tf.function call (cuts host overhead)", identity=False)
    seed: int = _f(0, "seed for weights, data order and augmentation (0 to 2**32 - 1)")
    deterministic: bool | None = _f(None, "make TensorFlow ops deterministic (same seed -> same result); unset: on "
                                          "for CPU replicas, where it is free, off on GPUs, where deterministic "
                                          "kernels cost throughput (summary.json records what ran)")
    # --- run control ----------------------------------------------------------------------------
    checkpoint_every: int = _f(0, "write a checkpoint every K steps (0 = only at the end); a rerun resumes", identity=False)
    eval_every_epoch: bool = _f(True, "evaluate on the held-out split after each epoch")
    timing_warmup_steps: int = _f(10, "steps excluded from throughput statistics (tracing, autotuning)", identity=False)
    divergence_factor: float = _f(5.0, "stop as diverged when the loss exceeds this multiple of its start")
    measure: bool = _f(True, "time compute / all-reduce / input separately after training (a few extra steps), "
                             "and count FLOPs for MFU; adds the breakdown fields to summary.json", identity=False)
    measure_budget: float = _f(0.10, "the most of the run's wall time measuring may take, as a fraction (0.10: 10%); "
                                     "the breakdown's rounds are sized to it, and left out (the run says so) where "
                                     "even their least does not fit: raise it for a breakdown of a short run",
                               identity=False)
    profile_steps: str | None = _f(None, "capture a TensorFlow profiler trace of steps A-B (e.g. 20-25) into "
                                         "RUN_DIR/tensorboard (view: TensorBoard's Profile tab, pip install "
                                         "'tftoolkit[profile]'); those steps are left out of the throughput figures", identity=False)
    noise_scale: bool = _f(False, "measure the gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et al. "
                                  "2018) from the per-replica and all-reduced gradients (one replica: two half "
                                  "batches); adds noise_scale to steps.csv and summary.json")

    # ------------------------------------------------------------------------------------------
    def __post_init__(self):
        # The types (with the coercions papermill needs), ranges, choices and how fields agree: config/rules.py.
        rules.coerce_types(self)
        rules.check_values(self)
        if self.profile_steps is not None:
            self.profile_range()  # checks the form; the run checks the range against its steps
        if self.noise_scale:
            # The small batch is a replica's (on one replica: half the batch). A batch of 1 cannot be halved,
            # and on several replicas one example per replica makes |G_small|^2 a single per-example norm,
            # the noisiest estimate there is: refuse both rather than report a number that has not settled.
            small = ((self.per_replica_batch or DEFAULT_PER_REPLICA_BATCH) if self.global_batch is None
                     else self.global_batch // (self.replicas * self.accumulate) if self.replicas else None)
            if small is not None and small < 2:
                raise ConfigError(f"noise_scale needs a per-replica batch of at least 2, got {small}; raise "
                                  "--per-replica-batch (or --global-batch"
                                  + (", or lower --accumulate" if self.accumulate > 1 else "") + ") or drop --noise-scale")

    def profile_range(self) -> tuple[int, int] | None:
        """(A, B) of ``profile_steps`` "A-B" (1-based, inclusive), or None."""
        if self.profile_steps is None:
            return None
        import re

        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", str(self.profile_steps))
        if not m:
            raise ConfigError(f"profile_steps: expected A-B, two step numbers like 20-25, got {self.profile_steps!r}")
        a, b = int(m.group(1)), int(m.group(2))
        if not 1 <= a <= b:
            raise ConfigError(f"profile_steps: need 1 <= A <= B, got {a}-{b}")
        return a, b

    # --- conversion -----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> "RunConfig":
        """Build from a plain dict (papermill parameters, CLI, YAML); unknown keys are rejected by name."""
        if not isinstance(params, dict):
            raise ConfigError(f"expected a dict of parameters, got {type(params).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s): {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
        return cls(**params)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **changes) -> "RunConfig":
        # The batch is given one way: setting one of the two re-derives the other (a resolved config records both).
        if "global_batch" in changes and "per_replica_batch" not in changes and changes["global_batch"] is not None:
            changes["per_replica_batch"] = None
        elif "per_replica_batch" in changes and "global_batch" not in changes and changes["per_replica_batch"] is not None:
            changes["global_batch"] = None
        return dataclasses.replace(self, **changes)

    # --- derived quantities (the only place they are computed) -----------------------------------
    def _need_replicas(self) -> int:
        if self.replicas is None:
            raise ConfigError("replicas is not resolved yet: call tftoolkit.engine.session.resolve(config) first")
        return self.replicas

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step: what the LR rules, the schedule, steps per epoch and throughput count."""
        n = self._need_replicas()
        if self.global_batch is not None:
            return self.global_batch
        return (self.per_replica_batch or DEFAULT_PER_REPLICA_BATCH) * n * self.accumulate

    @property
    def per_replica_batch_size(self) -> int:
        """Examples a replica computes on in one forward/backward pass (a micro-batch, with --accumulate)."""
        # Each replica gets an equal slice of the global batch; gradients are then summed across replicas
        # (and micro-batches) of per-example losses divided by the *global* batch: the 1-device mean gradient.
        return self.global_batch_size // (self._need_replicas() * self.accumulate)

    @property
    def micro_batch_size(self) -> int:
        """Examples all replicas compute on in one pass: the global batch without accumulation, 1/accumulate of it
        with. Synchronized batch norm normalises over these; evaluation batches are this size (what fits)."""
        return self.per_replica_batch_size * self._need_replicas()

    @property
    def replicas_per_worker(self) -> int:
        """Replicas each worker process runs (all of them when there is one worker)."""
        return self._need_replicas() // self.workers

    @property
    def lr_scale(self) -> float:
        ratio = self.global_batch_size / self.base_batch
        return {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[self.lr_rule]

    @property
    def learning_rate(self) -> float:
        """Peak learning rate after scaling for the global batch (Goyal et al. 2017: linear rule)."""
        return self.base_lr * self.lr_scale

    def steps_per_epoch(self, train_examples: int) -> int:
        """Optimizer steps in one pass over ``train_examples`` (a partial last batch counts as a step)."""
        full, rest = divmod(train_examples, self.global_batch_size)
        steps = full + (1 if rest and self.last_batch == "partial" else 0)
        if steps == 0:
            raise ConfigError(f"the training set has {train_examples} examples, fewer than one global batch of "
                              f"{self.global_batch_size}; lower the batch"
                              + (" or --accumulate" if self.accumulate > 1 else " or use --last-batch partial"))
        return steps

    def total_steps(self, train_examples: int) -> int:
        if self.steps is not None:
            return self.steps
        return max(1, int(round(self.epochs * self.steps_per_epoch(train_examples))))

    def warmup_steps(self, train_examples: int) -> int:
        return int(round(self.warmup_epochs * self.steps_per_epoch(train_examples)))

    def derived(self, train_examples: int) -> dict[str, Any]:
        """The numbers a run is about, logged at its start and saved with its config."""
        return {
            "replicas": self.replicas,
            "workers": self.workers,
            "replicas_per_worker": self.replicas_per_worker,
            "global_batch": self.global_batch_size,
            "per_replica_batch": self.per_replica_batch_size,
            "accumulate": self.accumulate,
            "learning_rate": self.learning_rate,
            "lr_scale": self.lr_scale,
            "train_examples": train_examples,
            "steps_per_epoch": self.steps_per_epoch(train_examples),
            "total_steps": self.total_steps(train_examples),
            "warmup_steps": self.warmup_steps(train_examples),
        }


# Fields whose None means "decided at set-up" (from the data, the devices, the other batch option): a run directory
# records what they were decided to be, and a rerun that leaves them unset matches it (rundir.prepare).
AUTO_KEYS = ("num_classes", "deterministic", "per_replica_batch", "image_size")

def _multiples(g: int, m: int) -> str:
    lo, hi = (g // m) * m, (g // m + 1) * m
    return f"{lo} or {hi}" if lo > 0 else f"{hi}"


def accumulation_plan(global_batch: int, replicas: int, max_per_replica_batch: int,
                      per_replica_batch: int | None = None, fits=None) -> dict:
    """How ``replicas`` reach ``global_batch`` = b x replicas x K: the largest per-replica batch b <=
    ``max_per_replica_batch`` (and with ``fits(b, K)`` true, when given) that divides global_batch / replicas, and
    K = its quotient; a larger micro-batch means fewer micro-steps, each a pass that does the same work faster.
    ``per_replica_batch``: fixed by the user, so only K is chosen. ConfigError, naming the fix, for a global batch
    that is not a whole number > 0, that does not divide among the replicas (or the fixed batch), or a fixed batch
    that does not fit. Returns {"global_batch", "replicas", "per_replica_batch", "accumulate"}."""
    g, n = global_batch, replicas
    if not (whole_number(g) and g > 0):
        raise ConfigError(f"--target-global-batch must be a whole number of examples > 0, got {g!r}")
    if not (whole_number(n) and n >= 1):
        raise ConfigError(f"replicas must be a whole number >= 1, got {n!r}")
    if per_replica_batch is not None:
        step = per_replica_batch * n
        if g % step:
            raise ConfigError(f"--target-global-batch {g} is not a multiple of --per-replica-batch {per_replica_batch} "
                              f"x {n} replica(s) = {step}: use {_multiples(g, step)}, or drop --per-replica-batch to "
                              "let the per-replica batch be chosen")
        if max_per_replica_batch is not None and per_replica_batch > max_per_replica_batch:
            raise ConfigError(f"--per-replica-batch {per_replica_batch} does not fit: the most a replica holds is "
                              f"{max_per_replica_batch}; lower it, or drop it to let the per-replica batch be chosen")
        k = int(g // step)
        if fits is not None and not fits(per_replica_batch, k):
            raise ConfigError(f"--per-replica-batch {per_replica_batch} with accumulate {k} does not fit (the sum of "
                              "the gradients accumulation keeps takes memory too); lower it, or drop it to let the "
                              "per-replica batch be chosen")
        return {"global_batch": int(g), "replicas": int(n), "per_replica_batch": int(per_replica_batch),
                "accumulate": k}
    if g % n:
        raise ConfigError(f"--target-global-batch {g} does not divide among {n} replica(s): use a multiple of {n} "
                          f"({_multiples(g, n)})")
    if not (whole_number(max_per_replica_batch) and max_per_replica_batch >= 1):
        raise ConfigError(f"the most a replica holds must be a per-replica batch >= 1, got {max_per_replica_batch!r}")
    m = g // n
    for k in range(max(1, -(-m // max_per_replica_batch)), m + 1):
        if m % k == 0 and (fits is None or fits(m // k, k)):
            return {"global_batch": int(g), "replicas": int(n), "per_replica_batch": int(m // k), "accumulate": int(k)}
    raise ConfigError(f"no per-replica batch reaches global batch {g} on {n} replica(s) within the memory; use a "
                      "smaller model or more memory")


# Keys that describe how a run is executed or reported, not what it computes (``identity=False`` on the field):
# changing them does not make a run directory belong to a different run. The chunking of the loop
# (steps_per_loop, checkpoint_every) cuts the same steps into other calls (tests/engine/test_equivalence.py), and
# how many processes share the replicas does not change what a run computes (tests/cluster/test_multiworker.py),
# so a run may resume with other values of these. tests/test_rundir.py checks every field both ways.
NON_IDENTITY_KEYS = frozenset(f.name for f in dataclasses.fields(RunConfig) if not f.metadata.get("identity", True))


def cli_fields():
    """The config fields exposed as train options, with their help text and choices."""
    return [f for f in dataclasses.fields(RunConfig) if f.metadata.get("cli", True)]


def field_types() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)
