"""Achieved fractions of peak on one real GPU, measured with PyTorch (not TensorFlow), as reference rows for the planner.

    python benchmarks/gpu_reference_pytorch.py all --out result.json     # about 3 minutes on an H200
    python benchmarks/gpu_reference_pytorch.py load --seconds 20         # a bf16 matmul load, for the NVML recorder

The planner forecasts a GPU's training rate from its catalogue peak times an achieved fraction. This script
measures, on the GPU at hand, what fraction of that peak three kinds of work reach:
- a square matrix product (8192^3) in bf16, fp16, TF32 and plain fp32;
- a ResNet-50-style 3x3 convolution (batch 256, 256 -> 256 channels, 56x56, channels-last), forward and
  forward + backward, in bf16 and TF32;
- whole training steps of torchvision's ResNet-50 (v1.5) and VGG16 (with its classifier, 138M parameters) on
  synthetic images already on the GPU (no input pipeline, like tf_cnn_benchmarks' synthetic rows), with SGD and
  momentum, under autocast bf16, autocast fp16 with a gradient scaler, and fp32 with TF32.
Each timing is CUDA events around N iterations after a warm-up (cudnn.benchmark on), repeated in 5 rounds; the
median and the spread of the rounds are kept. A model's FLOPs per image are counted by
torch.utils.flop_counter (2 x multiply-adds of matmuls and convolutions, forward; a training step is taken as 3x).
An NVML sampler records clocks, power and the clock-event (throttle) reasons during each phase.

It needs only PyTorch, torchvision and nvidia-ml-py: TensorFlow's own kernels may reach other fractions, so these
rows are labelled "PyTorch" wherever they are quoted. Benchmarks are not tests; the figures go into the catalogue
and docs/benchmarks/ by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time


def _nvml_sampler(stop: threading.Event, out: list, interval: float = 0.1) -> None:
    try:
        import pynvml as nvml
        nvml.nvmlInit()
        h = nvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:  # no NVML: timings still count
        out.append({"error": repr(exc)})
        return
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    while not stop.is_set():
        try:
            out.append({"t": time.time(), "reasons": int(reasons(h)),
                        "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                        "sm_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                        "temp_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)})
        except Exception as exc:
            out.append({"error": repr(exc)})
        stop.wait(interval)


def _phase_nvml(samples: list, t0: float, t1: float) -> dict:
    rows = [s for s in samples if "t" in s and t0 <= s["t"] <= t1]
    if not rows:
        return {}
    counts: dict[str, int] = {}
    for s in rows:
        counts[hex(s["reasons"])] = counts.get(hex(s["reasons"]), 0) + 1
    return {"samples": len(rows), "reasons": counts,
            "power_w_median": statistics.median(s["power_w"] for s in rows),
            "power_w_max": max(s["power_w"] for s in rows),
            "sm_mhz_median": statistics.median(s["sm_mhz"] for s in rows),
            "temp_c_max": max(s["temp_c"] for s in rows)}


def _time(fn, iters: int, rounds: int = 5, warmup: int = 3) -> list[float]:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_iter = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        per_iter.append(a.elapsed_time(b) / 1e3 / iters)
    return per_iter


def _row(name: str, flops: float, per_iter: list[float], peak: float | None, **extra) -> dict:
    rates = [flops / t / 1e12 for t in per_iter]
    med = statistics.median(rates)
    row = {"case": name, "tflops_median": med, "tflops_min": min(rates), "tflops_max": max(rates),
           "seconds_per_iter_median": statistics.median(per_iter), "peak_tflops": peak,
           "fraction_of_peak": (med / peak) if peak else None, **extra}
    print(json.dumps(row), flush=True)
    return row


def matmuls(peaks: dict) -> list[dict]:
    import torch
    n = 8192
    rows = []
    for name, dtype, tf32 in (("matmul bf16", torch.bfloat16, False), ("matmul fp16", torch.float16, False),
                              ("matmul tf32", torch.float32, True), ("matmul fp32", torch.float32, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        iters = 4 if name == "matmul fp32" else 20
        per = _time(lambda: a @ b, iters)
        unit = {"matmul bf16": "bf16", "matmul fp16": "fp16", "matmul tf32": "tf32", "matmul fp32": "fp32"}[name]
        rows.append(_row(name, 2.0 * n ** 3, per, peaks.get(unit), unit=unit))
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def convolutions(peaks: dict) -> list[dict]:
    import torch
    torch.backends.cudnn.benchmark = True
    rows = []
    nb, c, hw, k = 256, 256, 56, 3
    flops = 2.0 * nb * hw * hw * c * c * k * k
    for unit, dtype in (("bf16", torch.bfloat16), ("tf32", torch.float32)):
        torch.backends.cudnn.allow_tf32 = unit == "tf32"
        conv = torch.nn.Conv2d(c, c, k, padding=1, bias=False).cuda().to(dtype).to(memory_format=torch.channels_last)
        x = torch.randn(nb, c, hw, hw, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
        x.requires_grad_(True)
        with torch.no_grad():
            per = _time(lambda: conv(x), 10)
        rows.append(_row(f"conv3x3 fwd {unit}", flops, per, peaks.get(unit), unit=unit))

        def step():
            conv(x).sum().backward()
        per = _time(step, 10)
        rows.append(_row(f"conv3x3 fwd+bwd {unit}", 3 * flops, per, peaks.get(unit), unit=unit))
        del conv, x
    return rows


def _forward_flops(model, size: int) -> float:
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    x = torch.randn(1, 3, size, size, device="cuda")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return float(counter.get_total_flops())


def trainings(peaks: dict, which: tuple[str, ...] = ("resnet50", "vgg16")) -> list[dict]:
    import torch
    import torchvision
    torch.backends.cudnn.benchmark = True
    rows = []
    for name in which:
        build = getattr(torchvision.models, name)
        model = build(weights=None).cuda()
        params = sum(p.numel() for p in model.parameters())
        fwd = _forward_flops(model.eval(), 224)
        model.train()
        batch = 256 if name == "resnet50" else 64
        for unit in ("bf16", "fp16", "tf32"):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = unit == "tf32"
            m = model.to(memory_format=torch.channels_last)
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            scaler = torch.amp.GradScaler("cuda", enabled=unit == "fp16")
            x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (batch,), device="cuda")
            loss_fn = torch.nn.CrossEntropyLoss()
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": None}[unit]

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = loss_fn(m(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            per = _time(step, 10, rounds=5, warmup=8)
            ips = [batch / t for t in per]
            rows.append(_row(f"{name} train {unit}", 3 * fwd * batch, per, peaks.get(unit), unit=unit,
                             model=name, params=params, forward_gflops_per_image=fwd / 1e9, batch=batch,
                             images_per_sec_median=statistics.median(ips), images_per_sec_min=min(ips),
                             images_per_sec_max=max(ips), memory_gb=torch.cuda.max_memory_allocated() / 1e9))
            torch.cuda.reset_peak_memory_stats()
        del model
        torch.cuda.empty_cache()
    return rows


def load(seconds: float) -> None:
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["all", "matmul", "conv", "train", "load"])
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--seconds", type=float, default=20.0, help="for `load`: how long")
    ap.add_argument("--peaks", default="bf16=989.4,fp16=989.4,tf32=494.7,fp32=67.0",
                    help="the GPU's dense peaks in TFLOP/s per unit (default: the catalogue's H200 SXM)")
    args = ap.parse_args(argv)
    if args.what == "load":
        load(args.seconds)
        return 0
    import torch
    peaks = {k: float(v) for k, v in (p.split("=") for p in args.peaks.split(","))}
    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=_nvml_sampler, args=(stop, samples), daemon=True)
    sampler.start()
    result = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "peaks": peaks,
              "phases": []}
    phases = {"matmul": matmuls, "conv": convolutions, "train": trainings}
    for name, fn in phases.items():
        if args.what not in ("all", name):
            continue
        t0 = time.time()
        try:
            rows = fn(peaks)
        except Exception as exc:  # one phase failing still leaves the others' rows
            rows = [{"case": name, "error": repr(exc)}]
            print(json.dumps(rows[0]), flush=True)
        result["phases"].append({"phase": name, "rows": rows, "nvml": _phase_nvml(samples, t0, time.time())})
        print(json.dumps({"phase": name, "nvml": result["phases"][-1]["nvml"]}), flush=True)
    stop.set()
    sampler.join(timeout=2)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
