"""All-reduce bandwidth: each cross-device implementation, timed over a size sweep (like nccl-tests).

``tftoolkit bench allreduce`` (``allreduce.bench``) writes ``allreduce.csv``, one row per (implementation,
dtype, payload, size):

    impl, detail, replicas, dtype, payload, tensors, size_bytes, iters, repeats, time_s, time_min_s, time_err_s,
    time_raw_s, overhead_s, algbw_GBps, busbw_GBps, status, reason

Definitions are nccl-tests' (doc/PERFORMANCE.md), so the figures compare with a link's rated bandwidth:
``algbw = size / time`` and ``busbw = algbw * 2(n-1)/n`` (a ring all-reduce moves 2(n-1)/n of the buffer
over each link, whatever algorithm is used). GB/s here is 10^9 bytes/s.

Implementations (``IMPLS``):
  nccl               tf.distribute.NcclAllReduce (GPUs, Linux, CUDA build of TensorFlow)
  hierarchical_copy  tf.distribute.HierarchicalCopyAllReduce
  reduce_to_one      tf.distribute.ReductionToOneDevice (sum on one device, copy back)
  collective         CollectiveAllReduce with the RING implementation (what multi-worker training uses
                     without NCCL), requested through CommunicationOptions
  tf_default         whatever MirroredStrategy picks when given no cross_device_ops: on CPU replicas that is
                     CollectiveAllReduce(RING), so on CPU it is the same algorithm as ``collective``
An implementation that cannot run here (NCCL on CPU) is one row with status ``skipped`` and the reason.

Dtypes (``--dtype float32,bfloat16``, from ``config.ALLREDUCE_DTYPES``): the dtype the gradients cross the link
in (``--allreduce-dtype`` of a run). Every payload is the same float32 tensors in every dtype, so ``size_bytes`` and
the bandwidths count the bytes *moved in that dtype*: a bfloat16 row of a 4 MiB buffer (1 Mi elements) moves 2 MiB,
and its algbw is 2 MiB / its time. To compare dtypes, compare ``time_s`` of the same payload; a bandwidth tells how
well each dtype uses the link. ``--sizes`` name the float32 buffer (the gradients' own dtype), and the chain length
(``iters``) follows it, so both dtypes of a payload are timed in calls of the same shape.

Sizes parse as bytes with SI or IEC units: ``4KB`` = 4000, ``4KiB`` = 4096, ``64MiB``, ``1e6``, ``1.5MB``,
``4096``. A bare ``K``/``M``/``G`` is refused (nccl-tests means 2^10, most people mean 10^3). ``A..B`` sweeps
the powers of two between the bounds (inclusive), ``A,B,C`` lists exact sizes.

The timed unit is exactly what the training step does (``step_all_reduce``): the step's
``collectives.all_reduce_gradients`` with one pack (cast each tensor to the dtype, one ``all_reduce(SUM)`` of them
all, cast back) inside ``strategy.run`` inside a ``tf.function``. Every result of every all-reduce is an output of
the timed call, as every gradient is an input of the optimizer (Grappler makes a no-op of an all-reduce whose result
only orders other ops). Small buffers run several all-reduces back to back in one call (``iters``), and each timed
call is paired with the same call without the all-reduces, whose time is subtracted. That call leaves the casts out
too, so they stay in the timed part: a user who picks bfloat16 pays for them on every step.
``time_s`` is per all-reduce with the call's overhead removed (``time_raw_s`` without the subtraction,
``overhead_s`` the subtracted call, ``time_err_s`` the standard error of the difference). A difference the
noise of the call swallows (under two standard errors, after up to four times the repeats) is no measurement:
its row says ``unresolved``, with the bound it sets, and carries no bandwidth; on CPU-simulated replicas the
small sizes end there, since an all-reduce of a few microseconds hides in a call that varies by a hundred.
Before an implementation is timed in a dtype, its sum is checked once in that dtype (``check_sum``): one that loses
a replica's values is a ``failed`` row with the wrong sum, not a bandwidth; one that cannot all-reduce the dtype
here is a ``failed`` row with TensorFlow's reason.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np

from ...config import ALLREDUCE_DTYPES
from ...errors import ConfigError

# The engine (and with it TensorFlow) is imported by the functions that run something: the CLI's parser reads this
# module's constants, and `tftoolkit --help` must not start TensorFlow.

IMPLS = ("nccl", "hierarchical_copy", "reduce_to_one", "collective", "tf_default")
COLUMNS = ["impl", "detail", "replicas", "dtype", "payload", "tensors", "size_bytes", "iters", "repeats", "time_s",
           "time_min_s", "time_err_s", "time_raw_s", "overhead_s", "algbw_GBps", "busbw_GBps", "status", "reason"]
DEFAULT_SIZES = "4KiB..256MiB"
DEFAULT_MODELS = ("small_cnn", "resnet20")
FLOAT32_BYTES = 4
# Bits of each dtype's significand (the implicit one included): integers up to 2^bits are exact, and one rounding
# costs at most 2^-bits of the value. bfloat16 keeps 8 (about 2.4 decimal digits), float16 11, float32 24.
SIGNIFICAND_BITS = {"float32": 24, "bfloat16": 8, "float16": 11}
# Chain all-reduces in one tf.function call until a call moves about this many bytes (at most MAX_CHAIN), so a
# 4 KB all-reduce is not timed as "one Python call into TensorFlow". Large buffers run one per call.
CHAIN_BYTES = 4 * 2**20
MAX_CHAIN = 16
# A time is resolved when the chain minus the bare call exceeds this many standard errors of that difference;
# until then the bench adds repeats, up to this many times the repeats asked for.
RESOLVED_SE = 2.0
EXTRA_REPEATS = 4

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


# --- formulas (pinned by tests/test_allreduce.py) --------------------------------------------------------
def bus_factor(replicas: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n: the share of the buffer each link carries in a ring."""
    if replicas < 1:
        raise ConfigError(f"replicas must be >= 1, got {replicas}")
    return 2.0 * (replicas - 1) / replicas


def algbw_gbps(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 B/s): buffer size / time."""
    if not time_s > 0:
        return math.nan
    return size_bytes / time_s / 1e9


def busbw_gbps(size_bytes: float, time_s: float, replicas: int) -> float:
    """Bus bandwidth in GB/s: algbw x 2(n-1)/n, comparable to the rated per-direction link bandwidth."""
    return algbw_gbps(size_bytes, time_s) * bus_factor(replicas)


# --- size parsing ----------------------------------------------------------------------------------------
def parse_size(text) -> int:
    """Bytes from ``4KB`` (4000), ``4KiB`` (4096), ``1e6``, ``1.5MB`` or ``4096``; rounded down to whole
    float32 elements."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise ConfigError(f"cannot read size {text!r}; write e.g. 4096, 1e6, 4KB (=4000), 4KiB (=4096), 64MiB")
        unit = m.group(2).lower()
        if unit in ("k", "m", "g", "t"):
            raise ConfigError(f"size {text!r} is ambiguous: write {m.group(1)}{unit.upper()}B for 10^3 steps or "
                              f"{m.group(1)}{unit.upper()}iB for 2^10 steps")
        if unit not in _UNITS:
            raise ConfigError(f"unknown size unit {m.group(2)!r} in {text!r}; use B, KB, MB, GB (10^3) or KiB, MiB, "
                              "GiB (2^10)")
        value = float(m.group(1)) * _UNITS[unit]
    size = int(value) // FLOAT32_BYTES * FLOAT32_BYTES
    if size < FLOAT32_BYTES:
        raise ConfigError(f"size {text!r} is below one float32 ({FLOAT32_BYTES} bytes)")
    return size


def parse_sizes(text: str) -> list[int]:
    """``A..B``: powers of two from A to B inclusive; ``A,B,C``: those sizes; ``A``: one size."""
    text = str(text).strip()
    if ".." in text:
        lo_text, _, hi_text = text.partition("..")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo > hi:
            raise ConfigError(f"size sweep {text!r} runs backwards ({lo} > {hi} bytes); write the smaller bound first")
        sizes = [2**k for k in range(max(2, math.ceil(math.log2(lo))), int(math.log2(hi)) + 1) if lo <= 2**k <= hi]
        if not sizes:
            raise ConfigError(f"no power of two lies between {lo} and {hi} bytes; list exact sizes instead, "
                              f"e.g. {lo},{hi}")
        return sizes
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("no sizes given; write e.g. 4KiB..256MiB or 1MiB,16MiB")
    return sorted(set(parse_size(p) for p in parts))


def parse_impls(text: str) -> list[str]:
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    if not names or names == ["all"]:
        return list(IMPLS)
    unknown = [n for n in names if n not in IMPLS]
    if unknown:
        raise ConfigError(f"unknown all-reduce implementation(s) {', '.join(unknown)}; choose from all, "
                          f"{', '.join(IMPLS)}")
    return list(dict.fromkeys(names))


def parse_dtypes(text) -> list[str]:
    """``float32,bfloat16`` -> ["float32", "bfloat16"]: each one of config.ALLREDUCE_DTYPES, once, in order."""
    names = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p and p.strip()]
    unknown = [n for n in names if n not in ALLREDUCE_DTYPES]
    if not names or unknown:
        raise ConfigError(f"unknown all-reduce dtype(s) {', '.join(unknown) or repr(text)}; choose from "
                          f"{', '.join(ALLREDUCE_DTYPES)} (a comma list, e.g. float32,bfloat16)")
    return list(dict.fromkeys(names))


# --- strategies ------------------------------------------------------------------------------------------
def availability(impl: str, setup) -> tuple[bool, str]:
    """Whether ``impl`` can run on these devices, and why not."""
    from ...engine.strategy import nccl_available

    if impl == "nccl":
        if setup.kind != "GPU":
            return False, "NCCL needs GPUs; these replicas are logical CPU devices"
        return nccl_available()
    return True, ""


def make_strategy(impl: str, setup):
    """(strategy, CommunicationOptions or None, what it really all-reduces with) for ``impl``."""
    from ...engine.strategy import allreduce_name, make_bench_strategy

    strategy, options = make_bench_strategy(impl, setup)
    return strategy, options, allreduce_name(strategy, options)


# --- timing ----------------------------------------------------------------------------------------------
def chain_length(size_bytes: int, max_chain: int = MAX_CHAIN) -> int:
    return int(max(1, min(max_chain, CHAIN_BYTES // max(size_bytes, 1))))


def step_all_reduce(values, dtype: str = "float32", options=None):
    """The SUM all-reduce of a replica's ``values`` as the training step does it in ``dtype``: cast, one all-reduce
    call, cast back to each value's dtype (collectives.all_reduce_gradients with one pack; ``options``: the
    bench's CommunicationOptions, RING for the ``collective`` row). Call in a replica context."""
    from ...engine.collectives import all_reduce_gradients

    return all_reduce_gradients(list(values), dtype, options=options)


def sum_tolerance(replicas: int, dtype: str = "float32") -> float:
    """How far an all-reduced sum of the integers 1..n may lie from n(n+1)/2 in ``dtype``.

    Every partial sum of 1..n is an integer no larger than the total, so while the total fits the dtype's significand
    (2^8 = 256 in bfloat16: up to 22 replicas; 2048 in float16: up to 63) nothing rounds and the sum must be exact.
    Above, each of the n - 1 additions may round by half a unit in the last place, at most 2^-bits of the sum."""
    want = replicas * (replicas + 1) / 2
    bits = SIGNIFICAND_BITS[dtype]
    return 0.0 if want <= 2**bits else (replicas - 1) * 2.0**-bits * want


def check_sum(strategy, options=None, size: int = 64, dtype: str = "float32") -> tuple[bool, str]:
    """All-reduce replica r's value r + 1 once, as the step does in ``dtype`` (step_all_reduce), and check every
    replica got 1 + 2 + ... + n: exactly, or within ``sum_tolerance`` where the dtype cannot hold the sum.

    Run before an implementation is timed: a fast all-reduce that loses a replica's values (TensorFlow's
    hierarchical copy at odd replica counts) must not become a bandwidth figure."""
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    n = strategy.num_replicas_in_sync

    def replica():
        ctx = tf.distribute.get_replica_context()
        value = tf.fill([size], tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32))
        return step_all_reduce([value], dtype, options)[0]

    # A partial, not a lambda: TensorFlow's retracing detector counts traces per code object, and every check is
    # a new strategy traced once by design (doctor checks each implementation at two counts), not a user's loop.
    out = tf.function(functools.partial(strategy.run, replica), autograph=False)()
    want, tol = n * (n + 1) / 2, sum_tolerance(n, dtype)
    got = [v.numpy() for v in strategy.experimental_local_results(out)]
    wrong = [(r, float(g[0])) for r, g in enumerate(got) if not np.all(np.abs(g - want) <= tol)]
    if wrong:
        r, g = wrong[0]
        holds = "holds it exactly" if tol == 0 else f"rounds it by {tol:g} at most"
        return False, (f"wrong sum: replica {r} got {g:g} for 1 + ... + {n} = {want:g} in {dtype}, which {holds} "
                       f"({len(wrong)} of {len(got)} replicas wrong)")
    return True, ("exact sum" if tol == 0 else f"sum within {tol:g} of") + f" {want:g} in {dtype} on all {n} replicas"


def time_allreduce(strategy, shapes, *, dtypes=None, options=None, repeats: int = 10, warmup: int = 2,
                   iters: int | None = None, jit: bool = False, max_repeats: int | None = None,
                   allreduce_dtype: str = "float32") -> dict:
    """Seconds of one all-reduce (SUM) of [tensors of ``shapes`` and ``dtypes``] across the strategy's replicas,
    as the step does it in ``allreduce_dtype`` (step_all_reduce: the casts to it and back are timed with it).

    Each repeat times two calls of the same shape (engine.timer: devices synchronised at both ends): a chain of
    ``iters`` all-reduces, and the same chain with the all-reduces left out (the per-replica copies, the call's
    dispatch and the synchronisation). Their difference / ``iters`` is one all-reduce with the call's overhead
    subtracted: at 4 KiB that overhead is far more than NCCL's 10-20 us, and without the subtraction the low end of
    the curve would measure Python and the runtime, not the link. The call without all-reduces leaves the casts out
    as well: they are part of what the dtype costs. ``jit``: compile the replica function with XLA,
    as the step is under ``--jit`` (on GPUs MirroredStrategy then all-reduces with its collective ops, NCCL).

    The difference is resolved when its median exceeds RESOLVED_SE standard errors (the median's, from the
    spread of the per-repeat differences); until it is, repeats are added, ``repeats`` at a time, up to
    ``max_repeats`` (default: no more than ``repeats``).

    Returns {"time_s": median corrected (>= 0), "time_min_s", "time_err_s": its standard error,
    "resolved": bool, "bound_s": what an unresolved time is below (median + RESOLVED_SE errors),
    "time_raw_s": median uncorrected per all-reduce, "overhead_s": median of the no-all-reduce call, "iters",
    "repeats": repeats run}.
    """
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    shapes = [tuple(int(d) for d in s) for s in shapes]
    dtypes = list(dtypes) if dtypes is not None else [tf.float32] * len(shapes)
    size = sum(int(np.prod(s)) * tf.as_dtype(d).size for s, d in zip(shapes, dtypes))
    iters = iters or chain_length(size)

    def make(_ctx):
        return [tf.zeros(s, d) for s, d in zip(shapes, dtypes)]

    # The buffers are function arguments, so nothing is constant-folded.
    values = strategy.experimental_distribute_values_from_function(make)
    run, bare = (_chain_call(strategy, iters, reduce, options=options, jit=jit, allreduce_dtype=allreduce_dtype)
                 for reduce in (True, False))
    full, empty = _timed_pairs(run, bare, values, repeats=repeats, warmup=warmup, max_repeats=max_repeats)
    diff, err = difference(full, empty)
    corrected = np.maximum(np.array(full) - np.array(empty), 0.0) / iters
    return {"time_s": max(diff, 0.0) / iters, "time_min_s": float(corrected.min()), "time_err_s": err / iters,
            "resolved": bool(diff > RESOLVED_SE * err), "bound_s": (max(diff, 0.0) + RESOLVED_SE * err) / iters,
            "time_raw_s": float(np.median(full)) / iters, "overhead_s": float(np.median(empty)), "iters": iters,
            "repeats": len(full)}


def _chain_call(strategy, iters: int, reduce: bool, *, options, jit: bool, allreduce_dtype: str):
    """The tf.function that runs, on every replica, a chain of ``iters`` all-reduces of its buffers (``reduce``)
    or the same chain with the all-reduces left out (the call's own cost, to subtract)."""
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    def chain(xs):
        out, results = xs, []
        for _ in range(iters):
            # Each all-reduce starts when the previous one has finished on this replica, and reduces the same
            # input buffers (as nccl-tests does). Feeding one result into the next would let Grappler fold
            # the chain of reduce_to_one's AddN ops into one AddN over n^iters inputs.
            with tf.control_dependencies(out):
                ins = [tf.identity(x) for x in xs]
            # SUM over replicas in allreduce_dtype, as the training step reduces its gradients.
            out = step_all_reduce(ins, allreduce_dtype, options) if reduce else ins
            results += out
        # Every result is returned, as the step's optimizer consumes every gradient. Grappler's dependency optimizer
        # turns an op whose results are only waited on (control edges) into a no-op: a chain that returned one
        # tensor computed only that tensor's share of the last all-reduce (8 bfloat16 buffers of 1 Mi elements
        # timed as fast as one; two chained, half the time each). Both calls return the same number of tensors.
        return results

    # Partials, not closures or lambdas: TensorFlow's retracing detector counts traces per code object, and each
    # size of a sweep is its own unrolled chain, traced once by design (a lambda here warned "triggered tf.function
    # retracing" from the sixth size on, in notebooks 00 and 03).
    replica_fn = functools.partial(chain)
    if jit:
        replica_fn = tf.function(replica_fn, jit_compile=True, autograph=False)
    # autograph=False: nothing to convert; the chain above is a Python loop, unrolled on purpose.
    return tf.function(functools.partial(_run_on_replicas, strategy, replica_fn), autograph=False)


def _timed_pairs(run, bare, values, *, repeats: int, warmup: int, max_repeats: int | None):
    """(seconds of each ``run`` call, of each ``bare`` call), interleaved after ``warmup`` pairs, ``repeats`` pairs
    at a time until their difference is resolved or ``max_repeats`` would be passed."""
    from ...engine import timer

    for _ in range(max(1, warmup)):  # the first calls trace
        timer.timed(run, values)
        timer.timed(bare, values)
    repeats = max(1, int(repeats))
    cap = max(repeats, int(max_repeats or repeats))
    full, empty = [], []
    while True:
        for _ in range(repeats):  # interleaved, so both see the same machine state
            full.append(timer.timed(run, values)[1])
            empty.append(timer.timed(bare, values)[1])
        diff, err = difference(full, empty)
        if diff > RESOLVED_SE * err or len(full) + repeats > cap:
            return full, empty


def _run_on_replicas(strategy, replica_fn, xs):
    return strategy.run(replica_fn, args=(xs,))


def difference(full, empty) -> tuple[float, float]:
    """Median of the paired differences full - empty and its standard error: 1.2533 x the robust standard
    deviation (1.4826 x the median absolute deviation) / sqrt(n), the median's for roughly normal noise. One pair
    has no spread to judge by: its error is infinite, so it is never resolved."""
    d = np.asarray(full, dtype=float) - np.asarray(empty, dtype=float)
    med = float(np.median(d))
    if len(d) < 2:
        return med, math.inf
    sd = 1.4826 * float(np.median(np.abs(d - med)))
    return med, 1.2533 * sd / math.sqrt(len(d))


def gradient_shapes(model) -> tuple[list, list]:
    """Shapes and dtypes of a model's gradients (= its trainable variables), in the order the step reduces them."""
    vs = model.trainable_variables
    return [tuple(v.shape) for v in vs], [str(getattr(v, "dtype", "float32")) for v in vs]


def model_gradient_set(name: str, input_shape=(32, 32, 3), num_classes: int = 10) -> tuple[list, list]:
    from ...engine import models

    return gradient_shapes(models.build(name, tuple(input_shape), num_classes))
