"""FLOPs per example, the device's peak FLOP/s, and model FLOP utilisation (MFU).

Conventions (the usual ones: DeepSpeed's flops profiler, the PaLM/nanoGPT MFU):
- a multiply-add is 2 FLOPs; forward FLOPs are counted on a batch of one;
- training FLOPs per example = 3 x forward: the backward pass computes the gradient with respect to the
  activations and with respect to the weights, each about as costly as the forward pass;
- MFU = achieved FLOP/s / peak FLOP/s of all devices the run used, where achieved = training FLOPs per
  example x examples per second. Recomputation, padding or optimizer arithmetic never count as useful.

Forward FLOPs come from TensorFlow's graph profiler on the model's concrete forward function (it counts
MatMul/Conv2D as 2 x MACs and adds bias adds and element-wise ops that have a registered FLOP count). When
the profiler cannot run, ``analytic_forward_flops`` counts Conv2D / DepthwiseConv2D / Dense layers by hand
(2 x MACs + bias adds), which is what the profiler gives for a plain conv + dense model.

Peak FLOP/s: on GPUs the rated dense peak from ``tftoolkit.measure.peaks.peak_flops`` (the catalogue's figures, by
device name and precision); on CPU a measured float32 (or bfloat16) matmul rate of the host, measured once per machine
and kept in the toolkit's cache folder (fileio.cache_folder: every run and process on the host divides by the same
peak, and none pays the matmuls again: 0.7-1.3 s, a tenth of a short run's wall time on 2 cores). Simulated
replicas share the host's cores, so on CPU the peak of the whole run is the host's, not N times it.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from .. import fileio
from ..engine.devices import host_cores
from . import peaks

log = logging.getLogger("tftoolkit")

# Backward ~ 2 x forward (gradients for activations and for weights), so one training step per example costs ~3x.
TRAINING_FLOPS_FACTOR = 3.0
CPU_MATMUL_N = 2048  # square matmul for the CPU peak: large enough to reach the GEMM kernel's plateau
_cpu_peak_cache: dict[str, tuple[float, str]] = {}


# --- FLOPs per example -----------------------------------------------------------------------------------
def profiler_forward_flops(model, input_shape) -> int:
    """Forward FLOPs for one example from TensorFlow's graph profiler (the concrete function's graph, batch 1).

    The graph is profiled as traced: its variable reads carry their shapes, which is all the profiler's FLOP
    statistics need. Freezing the variables into constants first (convert_variables_to_constants_v2, the usual
    recipe, and what this did) gives the same count on every model the toolkit names (small_cnn to VGG16,
    InceptionV3, EfficientNet-B0) at the price of copying every weight into the graph: VGG16's 138M took 34 s
    of the 35 s count, against 0.1 s now."""
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    fn = tf.function(lambda x: model(x, training=False), autograph=False)
    concrete = fn.get_concrete_function(tf.TensorSpec([1, *input_shape], tf.float32))
    opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    opts["output"] = "none"
    level = tf.get_logger().level
    tf.get_logger().setLevel(logging.ERROR)  # the v1 profiler warns about deprecated shape helpers
    try:
        prof = tf.compat.v1.profiler.profile(graph=concrete.graph, options=opts)
    finally:
        tf.get_logger().setLevel(level)
    return int(prof.total_float_ops)


def _layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers and layer is not model:  # nested model or Sequential
            yield from _layers(layer)
        else:
            yield layer


def _node_shapes(layer):
    """(input shape, output shape) for each call of a layer in a functional model."""
    for node in getattr(layer, "_inbound_nodes", []):
        ins = getattr(node, "input_tensors", None) or []
        outs = getattr(node, "output_tensors", None) or []
        if ins and outs:
            yield tuple(ins[0].shape), tuple(outs[0].shape)


def analytic_forward_flops(model) -> int:
    """Forward FLOPs for one example from the Conv2D / DepthwiseConv2D / Dense layers: 2 x MACs + bias adds.

    Only these layers are counted (pooling, activations and normalisation are a few percent in CNNs);
    raises ValueError for a model with none of them or whose layer shapes are not known (subclassed models).
    """
    from keras import layers as L  # deferred: Keras starts TensorFlow (see import tensorflow above)

    total, counted = 0, 0
    for layer in _layers(model):
        if not isinstance(layer, (L.Conv2D, L.DepthwiseConv2D, L.Dense)):
            continue
        shapes = list(_node_shapes(layer))
        if not shapes:
            raise ValueError(f"layer {layer.name} has no known input/output shape (not a functional model?)")
        for in_shape, out_shape in shapes:
            if any(d is None for d in out_shape[1:]) or any(d is None for d in in_shape[1:]):
                raise ValueError(f"layer {layer.name} has unknown dimensions {in_shape} -> {out_shape}")
            use_bias = bool(getattr(layer, "use_bias", False))
            if isinstance(layer, L.Dense):
                k_in, k_out = in_shape[-1], out_shape[-1]
                positions = int(np.prod(out_shape[1:-1])) if len(out_shape) > 2 else 1
                macs = positions * k_in * k_out
                bias = positions * k_out if use_bias else 0
            else:
                kh, kw = layer.kernel_size
                out_positions = int(np.prod(out_shape[1:-1]))
                c_in, c_out = in_shape[-1], out_shape[-1]
                if isinstance(layer, L.DepthwiseConv2D):
                    macs = out_positions * c_out * kh * kw  # one kh x kw filter per output channel
                else:
                    groups = getattr(layer, "groups", 1) or 1
                    macs = out_positions * c_out * kh * kw * (c_in // groups)
                bias = out_positions * c_out if use_bias else 0
            total += 2 * macs + bias
            counted += 1
    if not counted:
        raise ValueError("no Conv2D, DepthwiseConv2D or Dense layer found to count")
    return int(total)


def forward_flops(model, input_shape) -> tuple[int, str]:
    """(forward FLOPs per example, how they were counted): the profiler, else the analytic count."""
    try:
        flops = profiler_forward_flops(model, input_shape)
        if flops > 0:
            return flops, "tf_profiler"
    except Exception as e:  # noqa: BLE001 - the analytic count below is the fallback
        log.debug("TF profiler FLOP count failed: %s", e)
    try:
        return analytic_forward_flops(model), "analytic_conv_dense"
    except ValueError as e:
        log.warning("cannot count this model's FLOPs (%s); MFU will be NaN", e)
        return 0, f"unavailable: {e}"


def training_flops_per_example(forward: float) -> float:
    return TRAINING_FLOPS_FACTOR * forward


# --- peak FLOP/s -----------------------------------------------------------------------------------------
CPU_PEAK_FILE = "cpu_peak.json"  # in fileio.cache_folder(): {machine and dtype key: [FLOP/s, source]}


def _machine() -> str:
    """What the kept CPU peak belongs to: the host's name, CPU model and cores, and TensorFlow's version (its GEMM)."""
    import platform

    import tensorflow as tf

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{platform.node()} | {model} | {host_cores()} cores | TensorFlow {tf.__version__}"


def cpu_matmul_peak(dtype: str = "float32", n: int = CPU_MATMUL_N, repeats: int = 3) -> tuple[float, str]:
    """Measured FLOP/s of an n x n tf.matmul on the host CPU: cached per process, and kept per machine in the
    cache folder (``CPU_PEAK_FILE``), so it is measured once on a host, not once per process.

    Each repeat gives two rates: FLOPs / wall seconds, and FLOPs / CPU seconds of this process x the cores.
    On a shared machine other jobs take cores away and the wall rate drops (measured here: a 2-core host
    gave 165 GFLOP/s by wall time with one core busy elsewhere, 335 by CPU time), which would put MFU
    above 100%; the CPU-time rate is what the cores can do. The peak is the best of either over the
    repeats (3: each costs measuring's budget; the run's first measurement pays them). Every run of one
    process shares the figure, so a scaling study divides by one peak.
    """
    key = f"{dtype}:{n}"
    if key in _cpu_peak_cache:
        return _cpu_peak_cache[key]
    path, machine = fileio.cache_folder() / CPU_PEAK_FILE, f"{_machine()} | {dtype} {n}x{n}"
    try:
        flops, source = fileio.read_json(path)[machine]
        _cpu_peak_cache[key] = (float(flops), str(source))
        return _cpu_peak_cache[key]
    except Exception:  # noqa: BLE001 - absent, unreadable or another machine's: measure it
        pass
    _cpu_peak_cache[key] = measure_cpu_peak(dtype, n, repeats)
    try:
        known = fileio.read_json(path) if path.exists() else {}
        known = known if isinstance(known, dict) else {}
        path.parent.mkdir(parents=True, exist_ok=True)
        fileio.write_json(path, {**known, machine: list(_cpu_peak_cache[key])})
    except Exception as e:  # noqa: BLE001 - an unwritable cache costs the next process the matmuls, nothing else
        log.debug("CPU peak not kept in %s: %s", path, e)
    return _cpu_peak_cache[key]


def measure_cpu_peak(dtype: str = "float32", n: int = CPU_MATMUL_N, repeats: int = 3) -> tuple[float, str]:
    """The matmuls ``cpu_matmul_peak`` times (it keeps what they give)."""
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    cores = host_cores()
    flop = 2.0 * n**3
    with tf.device("/cpu:0"):
        a = tf.random.stateless_uniform([n, n], seed=[1, 2], dtype=tf.float32)
        b = tf.random.stateless_uniform([n, n], seed=[3, 4], dtype=tf.float32)
        a, b = tf.cast(a, dtype), tf.cast(b, dtype)
        matmul = tf.function(lambda x, y: tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1, :1], tf.float32)), autograph=False)
        matmul(a, b).numpy()  # trace and warm up the GEMM kernel
        best_wall = best_cpu = 0.0
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            matmul(a, b).numpy()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            best_wall = max(best_wall, flop / wall)
            if cpu > 0:
                best_cpu = max(best_cpu, flop / cpu * cores)
    flops = max(best_wall, best_cpu)
    how = "wall time" if best_wall >= best_cpu else f"CPU time x {cores} cores"
    source = (f"measured: tf.matmul {n}x{n} {dtype} on the host CPU ({cores} cores), best of {repeats} by {how} "
              f"(wall-time rate {best_wall / 1e9:.0f} GFLOP/s), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return flops, source


def _gpu_precision(precision: str) -> str:
    """The peak-table column a Keras policy runs its matmuls at (float32 uses TF32 where TF enables it)."""
    if precision == "mixed_float16":
        return "fp16"
    if precision == "mixed_bfloat16":
        return "bf16"
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    return "tf32" if tf.config.experimental.tensor_float_32_execution_enabled() else "fp32"


def gpu_names(setup) -> list[str]:
    """The device name of each replica's GPU, from TensorFlow's own list (indexed by ``setup.tf_gpus``, positions
    in that list: never by NVML numbers, which differ from them under a CUDA_VISIBLE_DEVICES mask)."""
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    phys = tf.config.list_physical_devices("GPU")
    names = []
    for i in setup.tf_gpus if setup.tf_gpus is not None else range(len(setup.devices)):
        details = tf.config.experimental.get_device_details(phys[i]) if i < len(phys) else {}
        names.append(details.get("device_name", "unknown GPU"))
    return names


def peak_flops(setup, precision: str) -> tuple[float, str]:
    """(peak FLOP/s of all devices the run uses, where the figure comes from); NaN when unknown."""
    if setup.kind != "GPU":
        dtype = "bfloat16" if precision == "mixed_bfloat16" else "float32"
        flops, source = cpu_matmul_peak(dtype)
        return flops, source + "; simulated replicas share these cores, so this is the peak of the whole run"
    col = _gpu_precision(precision)
    names = gpu_names(setup)
    total, used = 0.0, []
    for name in names:
        peak = peaks.peak_flops(name, col)
        if peak is None and col == "tf32":  # a GPU without TF32 tensor cores runs float32 at the FP32 rate
            col_used, peak = "fp32", peaks.peak_flops(name, "fp32")
        else:
            col_used = col
        if peak is None:
            return math.nan, (f"unavailable: no rated {col} peak for {name!r} in the catalogue "
                              "(add the datasheet figure, with its source, to tftoolkit/catalogue/gpus.toml)")
        total += peak
        used.append(f"{name} {col_used} {peak / 1e12:g} TFLOP/s")
    uniq = sorted(set(used))
    return total, "table: " + ("; ".join(uniq) if len(uniq) > 1 else uniq[0]) + f" x {len(names)} GPU(s)"


def run_peak(setup, precision: str, workers: int = 1, hosts: int = 1) -> tuple[float, str]:
    """The peak of every device of the run, all workers': ``images_per_sec`` counts every worker's images, so
    its denominator must count every worker's devices. This worker's GPUs x ``workers`` (workers are assumed to
    have the same GPUs, as MultiWorkerMirroredStrategy's equal split assumes); on CPU, the host's peak x the
    distinct ``hosts`` (workers launched on one host share its cores)."""
    peak, source = peak_flops(setup, precision)
    times = workers if setup.kind == "GPU" else hosts
    if times > 1 and peak == peak:
        what = f"{workers} workers, assumed alike" if setup.kind == "GPU" else f"{hosts} hosts, assumed alike"
        return peak * times, f"{source}; x {times} ({what})"
    return peak, source


def utilisation(model, input_shape, precision: str, setup, images_per_sec: float, workers: int = 1,
                hosts: int = 1) -> dict:
    """The FLOP fields of summary.json. ``images_per_sec`` is the whole run's (every worker's images)."""
    fwd, how = forward_flops(model, input_shape)
    per_example = training_flops_per_example(fwd) if fwd else math.nan
    achieved = per_example * images_per_sec if images_per_sec == images_per_sec else math.nan
    try:
        peak, source = run_peak(setup, precision, workers, hosts)
    except Exception as e:  # noqa: BLE001 - no peak is a NaN MFU, not a failed run
        peak, source = math.nan, f"unavailable: {type(e).__name__}: {e}"
    mfu = achieved / peak if peak and peak == peak and achieved == achieved else math.nan
    return {"flops_per_example": per_example, "forward_flops_per_example": fwd or math.nan, "flops_source": how,
            "achieved_flops": achieved, "peak_flops": peak, "peak_flops_source": source, "mfu": mfu}
