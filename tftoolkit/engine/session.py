"""The set-up every entry point shares: config -> devices -> data -> global TF settings -> strategy.

Training, the finders, the input benchmark, the benchmarks and the tests all start here, so each runs
with the run's own seed, determinism and precision policy, on the same devices and strategy:

    sess = session.start(config)          # or start(config, data=(x, y)), start(config, cache=False)
    sess.config, sess.setup, sess.source, sess.strategy, sess.impl

A multi-worker run joins its cluster first (the strategy must be its first TensorFlow op) and hands the
devices and the strategy in: ``start(config, setup=..., strategy=(strategy, impl))``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..config import RunConfig
from ..errors import ConfigError, address_space_limit
from ..data import registry, service
from ..data.source import SYNTHETIC_TRAIN, SYNTHETIC_VAL
from . import devices, feed, models
from .models import qualified_name
from .step import jit_effective

log = logging.getLogger("tftoolkit")


def resolve(config: RunConfig | dict, model=None) -> RunConfig:
    """The one resolution of what the user asked, before anything is set up: validate it (a dict becomes a
    RunConfig), fix the replica count for this machine, record the per-replica batch as the run uses it, and name
    ``model`` (a callable replacing config.model) in it. ``start`` resolves what it is given unless told it is
    resolved already (``resolved=True``: an entry point that needed the resolved config before the set-up, as
    ``train`` does for the run directory, resolves once and hands it on). What the set-up then decides (classes and
    image size from the data, op determinism from the devices) ``start`` records in one replace."""
    if isinstance(config, dict):
        config = RunConfig.from_dict(config)
    if not isinstance(config, RunConfig):
        raise ConfigError(f"expected a RunConfig or a dict, got {type(config).__name__}")
    if config.replicas is None:
        # replicas counts every worker's: each runs the GPUs named, or all it has, or 1 replica on CPU
        config = config.replace(replicas=config.workers * devices.resolve_replicas(None, config.gpus))
    if config.per_replica_batch is None:
        # Recorded as the run uses it (config.json): the global batch's share, or the default.
        config = config.replace(per_replica_batch=config.per_replica_batch_size, global_batch=config.global_batch)
    if model is not None:
        config = with_model(config, model)
    return config


def with_model(config: RunConfig, model) -> RunConfig:
    """``config`` with ``model`` (a callable) named in it: what the run directory records and resumes by."""
    if not callable(model):
        raise ConfigError(f"model= takes a callable fn(input_shape, num_classes) -> keras.Model, got "
                          f"{type(model).__name__}; a model name goes in the config (model='small_cnn')")
    return config.replace(model=qualified_name(model))


def deterministic_effective(config: RunConfig, setup: devices.DeviceSetup, jit: bool) -> tuple[bool, str]:
    """(whether ops run deterministically, why): ``--deterministic`` unset (None) means on where it is free.

    On CPU replicas deterministic ops cost nothing measurable, so a seed reproduces a run exactly. On GPUs they
    force deterministic cuDNN algorithms and kernels (and refuse some ops), which costs throughput: a
    measurement there runs the fast kernels unless ``--deterministic`` asks otherwise. Under XLA (only when
    it really compiles the step: ``jit``) there is no deterministic MaxPool gradient, so ops stay
    non-deterministic. summary.json records the outcome (``deterministic``), and the report prints it beside
    the throughput.
    """
    if jit and config.deterministic is not False:
        return False, ("XLA has no deterministic MaxPool gradient; data order and initial weights still follow "
                       "--seed" + (" (--deterministic ignored)" if config.deterministic else ""))
    if config.deterministic is not None:
        return bool(config.deterministic), "as asked (--deterministic)" if config.deterministic else \
            "as asked (--no-deterministic)"
    if setup.kind == "GPU":
        return False, "auto: GPUs run their fastest (non-deterministic) kernels; --deterministic to reproduce bit for bit"
    return True, "auto: deterministic ops are free on CPU replicas"


def apply_global_settings(config: RunConfig, setup: devices.DeviceSetup, deterministic: bool = True) -> None:
    """Seed, op determinism and the Keras precision policy: process-wide, so set for every run."""
    import keras  # deferred: start() times TensorFlow's import apart
    import tensorflow as tf  # deferred: start() times TensorFlow's import apart

    from tensorflow.python.framework import config as tf_config  # disable_op_determinism is not exported

    keras.utils.set_random_seed(config.seed)
    # Op determinism is process-wide, so it is set (or unset) for every run: a notebook may sweep over both.
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()
    if config.precision == "mixed_float16" and setup.kind != "GPU":
        log.warning("mixed_float16 on CPU runs, but slowly: CPUs have no fast float16 math (use float32 or "
                    "mixed_bfloat16 here)")
    keras.mixed_precision.set_global_policy(config.precision)


@dataclass
class Session:
    """What a run needs before it builds a model: the resolved config, devices, examples and strategy."""

    config: RunConfig
    setup: devices.DeviceSetup
    source: Any            # data.source.DataSource
    strategy: Any
    impl: str              # the all-reduce implementation the strategy uses
    model: Any = None      # a Python callable building the model, when one replaces config.model
    loss: Any = None       # a loss object or callable (engine/losses.py), when one replaces config.loss
    metrics: Any = None    # metric objects, when they replace config.metrics
    started: float = 0.0   # time.time() when set-up began: the start of the run's wall clock
    import_s: float = 0.0  # of which importing TensorFlow (when this set-up was the first to import it)
    jit: bool = False           # the step is XLA-compiled (config.jit, where XLA can compile it)
    deterministic: bool = True  # TensorFlow's op determinism, as set for this run
    deterministic_reason: str = ""
    cross_device_ops: str = ""  # what the step's all-reduce really is (impl, or "collective_nccl (xla)")

    @property
    def derived(self) -> dict:
        return self.config.derived(self.source.train_examples)


def with_task(config: RunConfig, loss=None, metrics=None) -> tuple:
    """(config, loss, metrics): a loss named by a string, and metrics that are all names, go into the config (recorded
    in config.json, and what a sweep or the CLI can say: --loss, --metrics); objects and callables stay in this
    process (Session.loss, Session.metrics)."""
    if isinstance(loss, str):
        config, loss = config.replace(loss=loss), None
    if isinstance(metrics, str):
        metrics = [metrics]
    if isinstance(metrics, (list, tuple)) and metrics and all(isinstance(m, str) for m in metrics):
        config, metrics = config.replace(metrics=",".join(metrics)), None
    return config, loss, metrics


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def check_memory(config: RunConfig, available: int | None) -> None:
    """A ConfigError, before anything is allocated, when one global batch at ``config.image_size`` (as the float32
    the replicas compute on; its activations take more still) or the synthetic set the config generates (uint8,
    held whole) is larger than the ``available`` bytes of host memory. Unknown ``available``: nothing is checked."""
    size = config.image_size
    if available is None or size is None:
        return
    image = size * size * 3
    batch = config.global_batch_size * image * 4
    if batch > available:
        raise ConfigError(f"--image-size {size}: one global batch ({config.global_batch_size} images) is {_gb(batch)} "
                          f"as float32, but the host has {_gb(available)} free; lower --image-size or the batch")
    if config.dataset == "synthetic":
        n = min(SYNTHETIC_TRAIN, config.train_images or SYNTHETIC_TRAIN)
        held = (n + SYNTHETIC_VAL) * image
        if held > available:
            raise ConfigError(f"the synthetic set at --image-size {size} ({n} + {SYNTHETIC_VAL} images) is {_gb(held)}, "
                              f"held in memory, but the host has {_gb(available)} free; lower --image-size or "
                              "--train-images")


def start(config: RunConfig | dict, data=None, *, cache: bool = True, setup: devices.DeviceSetup | None = None,
          strategy: tuple | None = None, load_data: bool = True, model=None, loss=None, metrics=None,
          worker: tuple[int, int] | None = None, resolved: bool = False) -> Session:
    """Set up a run of ``config``; ``data`` replaces the dataset (see data.registry.load_source: NumPy arrays or
    tf.data datasets), ``model`` (a callable) replaces ``config.model``, whose name it records.

    ``load_data=False`` skips the examples (a benchmark that brings its own); ``cache`` is passed to
    data.registry.load_source (recorded only). ``worker`` (this worker, workers): for ``--input-sharding file``.
    ``resolved``: ``config`` is what ``resolve`` returned (model named in it), so it is not resolved again.
    """
    started = time.time()
    devices.import_tensorflow()  # timed apart: every TensorFlow program pays it, not this run's work

    import_s = time.time() - started
    # Deferred: it imports TensorFlow, after the import timed above.
    from .strategy import check_allreduce_dtype, effective_cross_device_ops, make_strategy

    if not resolved:
        config = resolve(config, model)
    elif not (isinstance(config, RunConfig) and config.replicas is not None):
        raise ConfigError("start(resolved=True) takes the config session.resolve returned")
    if model is None:
        models.resolve(config.model)  # a model that cannot be imported stops the run before any data is read
    if config.data_service is not None:
        service.check_reachable(config.data_service)  # before the data is read and anything trains
    if data is None and load_data:
        check_memory(config, feed.host_available_bytes())
    cap = address_space_limit()
    if cap is not None:
        # Seen on small_cnn, 2 CPU replicas: at ulimit -v 3000000 the step's graph was being built when the main
        # thread waited for good on a TensorFlow graph lock no thread was using, holding the GIL (so no Python
        # thread, the monitor's included, ran again); at 2500000 and 2000000 the process died of SIGSEGV. Nothing in
        # Python can end such a wait, so what the toolkit can do is say so before it starts.
        log.warning("an address-space limit of %.1f GB is set (ulimit -v): TensorFlow reserves far more virtual "
                    "memory than it uses, and an allocation that fails inside it can crash the process or leave it "
                    "stuck for good; lift the limit and cap memory with a cgroup instead (systemd-run -p "
                    "MemoryMax=..., docker --memory)", cap / 1e9)
    if setup is None:
        setup = devices.init(config.replicas_per_worker, config.gpus)
    source = registry.load_source(config, data, cache=cache, worker=worker) if load_data else None
    decided: dict[str, Any] = {}  # what the set-up decides where the config left it unset, recorded as what ran
    if source is not None and config.num_classes != source.num_classes:
        if config.num_classes is not None:
            raise ConfigError(f"num_classes={config.num_classes}, but {source.name} has {source.num_classes} classes; "
                              "leave num_classes unset (it is taken from the data)")
        decided["num_classes"] = source.num_classes  # what config.json records: the data's count
    if source is not None and source.structured:
        if config.image_size is not None:
            raise ConfigError(f"image_size={config.image_size}, but the data given is not one image array; leave "
                              "image_size unset for another task's data")
    elif source is not None:
        h, w = source.input_shape[:2]
        if config.image_size is None and h == w:
            decided["image_size"] = h  # recorded as the data was decoded
        elif config.image_size is not None and (h, w) != (config.image_size, config.image_size):
            raise ConfigError(f"image_size={config.image_size}, but the data given is {h}x{w}; leave image_size "
                              "unset for arrays and datasets passed in (or resize them)")
    jit = jit_effective(config, setup.kind, setup.replicas)
    if config.jit and not jit:
        log.warning("--jit ignored: XLA cannot compile one step across several simulated CPU replicas "
                    "(it works on GPUs, and on one CPU replica); summary.json records jit_effective: false")
    deterministic, why = deterministic_effective(config, setup, jit)
    if config.deterministic and not deterministic:
        log.warning("ops are not deterministic for this run: %s", why)
    apply_global_settings(config, setup, deterministic)
    # What ran, recorded as the run's config (config.json, the run's identity): unset means auto, decided here.
    decided["deterministic"] = deterministic
    config = config.replace(**decided)
    if strategy is None:
        strategy = make_strategy(setup, config.cross_device_ops)
    effective = effective_cross_device_ops(strategy[1], setup, jit)
    if effective != strategy[1]:
        log.info("all-reduce: %s (under XLA MirroredStrategy ignores cross_device_ops=%s)", effective, strategy[1])
    check_allreduce_dtype(config.allreduce_dtype, effective, setup, jit, config.replicas)
    return Session(config, setup, source, *strategy, model=model, loss=loss, metrics=metrics, started=started,
                   import_s=import_s, jit=jit,
                   deterministic=deterministic, deterministic_reason=why, cross_device_ops=effective)
