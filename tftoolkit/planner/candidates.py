"""Candidate servers side by side (notebook 07, choosing hardware): for each, the planner's forecast with its
interval, the time and energy per epoch, and, with a price, the cost per epoch.

    time per epoch   = examples per epoch / images_per_sec           (its interval from images_per_sec's)
    energy per epoch = GPUs x TDP x time per epoch                   (TDP from tftoolkit/catalogue/gpus.toml: an
                                                                       upper bound on the GPUs' draw, no host power)
    cost per epoch   = GPUs x price per GPU-hour x time per epoch    (when a price is given)
    fits             = one GPU's training memory at the per-GPU batch under the GPU's memory (planner.memory, on
                       the batch finder's estimate counted on the model); largest_per_replica_batch: what would fit
"""

from __future__ import annotations

import pandas as pd

from ..errors import ConfigError
from . import predict
from .plan import Plan
from .catalogue_links import find_gpu, find_system


def candidate(spec) -> dict:
    """A candidate server: a catalogue system name, or a dict with ``gpu`` and ``interconnect`` (and optionally
    ``name``, ``gpus_per_host``, ``inter_host``, ``images_per_sec``, ``price_per_gpu_hour``)."""
    if isinstance(spec, str):
        system = find_system(spec)
        if system is None or system.generic:
            raise ConfigError(f"{spec!r} is not a catalogue system with its own GPU; give a dict with gpu and "
                              "interconnect")
        return {"name": spec, "gpu": system.gpu, "interconnect": spec, "gpus_per_host": system.gpus}
    spec = dict(spec)
    if "gpu" not in spec:
        raise ConfigError(f"candidate {spec!r} needs a gpu")
    spec.setdefault("name", f"{spec['gpu']} over {spec.get('interconnect') or 'PCIe'}")
    return spec


def compare(candidates, *, per_replica_batch: int, model=None, params: int | None = None,
            replica_counts=(1, 2, 4, 8), examples_per_epoch: int = 1_281_167, precision: str = "float32",
            forward_flops: float | None = None, image_size: int = 224) -> pd.DataFrame:
    """One row per candidate and GPU count: the forecast with its interval, time, energy and cost per epoch.

    ``model``: a registered name, a keras.applications name, ``package.module:function`` or a callable
    ``fn(input_shape, num_classes)``; its parameters and forward FLOPs are counted (planner.modelsize, which builds
    it with TensorFlow) unless ``params`` (and, for a candidate without a rate, ``forward_flops``) are given; then
    the memory check (``fits``) counts the weights, gradients and optimizer slots only, not the activations."""
    counted = None
    if model is not None and (params is None or forward_flops is None):
        from . import modelsize  # builds the Keras model: TensorFlow only when something must be counted

        n, fwd, _ = modelsize.count(model, image_size)
        params = params or n
        forward_flops = forward_flops or fwd
        counted = modelsize.memory(model, image_size, precision)  # the activations too, on the model just built
    if params is None:
        raise ConfigError("give a model to count, or its params")
    if callable(model):
        from ..engine.models import qualified_name  # how a model callable is named everywhere else

        name = qualified_name(model)
    else:
        name = model
    frames = []
    for spec in candidates:
        c = candidate(spec)
        plan = Plan(gpu=c["gpu"], per_replica_batch=per_replica_batch, params=params, model=name,
                    gpus_per_host=c.get("gpus_per_host", 8), interconnect=c.get("interconnect"),
                    inter_host=c.get("inter_host"), images_per_sec=c.get("images_per_sec"),
                    forward_flops=forward_flops, precision=precision, replica_counts=replica_counts)
        result = predict.run_plan(plan, counted=counted)
        mem = result["memory"]
        df = result["frame"].assign(candidate=c["name"], memory_gb=mem["need_gb"], fits=mem["fits"],
                                    largest_per_replica_batch=mem["largest_batch"])
        tdp = find_gpu(c["gpu"]).tdp_w
        for col, ips in (("", "images_per_sec"), ("_low", "images_per_sec_high"), ("_high", "images_per_sec_low")):
            # a faster rate is a shorter epoch: the epoch's low end comes from the rate's high end
            df["epoch_s" + col] = examples_per_epoch / df[ips]
        df["energy_kwh_per_epoch"] = df["replicas"] * (tdp or float("nan")) * df["epoch_s"] / 3.6e6
        df["compute_from"] = "given rate" if c.get("images_per_sec") else "FLOPs over the peak"
        price = c.get("price_per_gpu_hour")
        df["cost_per_epoch"] = df["replicas"] * price * df["epoch_s"] / 3600 if price else float("nan")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
