"""tftoolkit env, doctor, scale and bench: what the machine offers, whether the toolkit can be trusted on it, how
training scales, one part measured alone."""

from __future__ import annotations

import argparse
import os

from ..config import SCALING_MODES
from .common import QUIET_HELP, Parser, add_config_options, add_quiet, config_from_args, refuse
from .sections import OUTPUT


def add(sub) -> None:
    p = sub.add_parser("env", help="hardware and software report (GPUs, interconnect topology, TensorFlow build)",
                       description="Report Python, TensorFlow build, CPU, memory, GPUs and their interconnect topology.")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=env)
    _add_doctor(sub)
    _add_scale(sub)
    bench = sub.add_parser("bench", help="micro-benchmarks: input pipeline, all-reduce bandwidth",
                           description="Measure one part of the system alone.")
    bench_sub = bench.add_subparsers(dest="bench", metavar="WHAT", parser_class=Parser)
    bench_sub.required = True
    _add_bench(bench_sub)


def env(args) -> int:
    import json

    from ..measure import hardware

    report = hardware.collect()
    print(json.dumps(report, indent=2) if args.json else hardware.format_report(report))
    return 0


def _add_doctor(sub) -> None:
    from ..measure.doctor import CHECKS

    p = sub.add_parser("doctor", help="check that the toolkit's assumptions hold on this machine (run first on a "
                                      "new GPU server)",
                       description="Check this machine before trusting any figure: TensorFlow's build against the "
                                   "driver (build), the GPUs TensorFlow sees against NVML under CUDA_VISIBLE_DEVICES "
                                   "(visibility), exact all-reduce sums at this replica count and an odd one "
                                   "(allreduce_sum), N replicas equal to 1 device (equivalence), data placement on "
                                   "the devices (placement), synchronised timing (timing), a measured matmul rate "
                                   "against the peak table (peak), NVML readings (nvml) and NCCL's transport per GPU "
                                   "pair (nccl_transport). Without GPUs the checks that apply run on simulated CPU "
                                   "replicas and the others say skip, with the reason. Exit code 0 when no check "
                                   "failed, 1 otherwise.")
    p.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="replicas to check with: the first N GPUs, or N simulated CPU devices without GPUs "
                        "(default: every GPU, or 4 simulated)")
    p.add_argument("--check", action="append", choices=CHECKS, metavar="NAME",
                   help=f"run only this check (repeatable): {', '.join(CHECKS)}")
    p.add_argument("--json", action="store_true",
                   help='print {"checks": [{"name", "status": "pass|fail|skip", "figure", "detail", "fix", '
                        '"seconds"}]} instead of the table')
    p.set_defaults(func=doctor)


def doctor(args) -> int:
    from ..measure import doctor as doc

    checks = doc.run(args.replicas, only=args.check)
    print(doc.as_json(checks) if args.json else doc.format_table(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


def _add_scale(sub) -> None:
    p = sub.add_parser("scale", help="train at several replica counts; speedup and efficiency table",
                       description="Run the same training at each replica count (OUT/runs/r<N>/) and write "
                                   "OUT/scaling.csv: throughput, speedup and efficiency relative to the smallest "
                                   "count, and each run's compute / all-reduce / input-wait breakdown.")
    g = p.add_argument_group("the study")
    g.add_argument("--replica-counts", required=True, metavar="N,M,...", dest="replica_counts",
                   help="replica counts, e.g. 1,2,4 (each once, all >= 1)")
    g.add_argument("--mode", choices=SCALING_MODES, default="weak",
                   help="weak: keep the per-replica batch; strong: keep the global batch (--global-batch, or "
                        "--per-replica-batch x the smallest count) (default: weak)")
    refuse(p, "--replicas", "--replica-counts 1,2,4", "scale trains at a list of replica counts")
    out = add_config_options(p, skip=("replicas", "gpus"))[OUTPUT]
    out.add_argument("--out", required=True, help="study folder; rerunning the same study there reuses finished runs")
    out.add_argument("--force", action="store_true", help="overwrite run folders that hold a different run")
    out.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    p.set_defaults(func=scale)


def scale(args) -> int:
    from ..experiments import scale

    frame = scale.scale(config_from_args(args, skip=("replicas", "gpus")), args.replica_counts, args.out, args.mode,
                        force=args.force, quiet=args.quiet)
    cols = ["replicas", "global_batch", "images_per_sec", "speedup", "efficiency", "communication_fraction", "status"]
    print(frame[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"written: {args.out}/scaling.csv (speedup and efficiency relative to "
          f"{int(frame['baseline_replicas'].iloc[0])} replica(s))")
    return 0 if (frame["status"] == "ok").all() else 1


def _add_bench(bench_sub) -> None:
    from ..config import ALLREDUCE_DTYPES
    from ..measure.allreduce import CHAIN_BYTES, DEFAULT_MODELS, DEFAULT_SIZES, IMPLS, MAX_CHAIN

    p = bench_sub.add_parser("allreduce", help="all-reduce time and bus bandwidth per implementation and size",
                             description="Time the gradient all-reduce of every cross-device implementation over a "
                                         "size sweep and for real models' gradient sets; write allreduce.csv with "
                                         "nccl-tests' algbw = size/time and busbw = algbw x 2(n-1)/n (GB = 10^9 B).")
    p.add_argument("--replicas", type=int, required=True, help="replicas to all-reduce across (GPUs, or simulated "
                                                               "CPU devices)")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="A..B: powers of two from A to B; or A,B,C exact sizes. KB/MB/GB = 10^3/10^6/10^9 bytes, "
                        f"KiB/MiB/GiB = 2^10/2^20/2^30; plain numbers (4096, 1e6) are bytes (default: {DEFAULT_SIZES})")
    p.add_argument("--impl", default="all", help=f"all, or a comma list of {', '.join(IMPLS)}; one that cannot run "
                                                 "here is a row with its reason (default: all)")
    p.add_argument("--dtype", default="float32", metavar="DTYPE,...",
                   help=f"a comma list of {', '.join(ALLREDUCE_DTYPES)}: time each implementation with the gradients "
                        "cast to each dtype, all-reduced, cast back (as --allreduce-dtype trains; the casts are "
                        "timed). --sizes name the float32 buffer; size_bytes and bandwidths count the bytes moved in "
                        "the row's dtype, half for bfloat16 (default: float32)")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per size; the median is reported, and a time within "
                                                            "the call's noise gets up to 4x as many before its row "
                                                            "says unresolved (default: 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first (tracing, allocation) (default: 2)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="also all-reduce these models' gradient sets, as the training step does; 'none' to skip "
                        f"(default: {','.join(DEFAULT_MODELS)})")
    p.add_argument("--image-size", type=int, default=32, help="input side for building --models (default: 32)")
    p.add_argument("--num-classes", type=int, default=10, help="classes for building --models (default: 10)")
    p.add_argument("--max-chain", type=int, default=MAX_CHAIN,
                   help=f"at most this many all-reduces back to back per timed call (small buffers are chained until "
                        f"a call moves {CHAIN_BYTES // 2**20} MiB, so a call's overhead is not what is timed); the "
                        f"chain is unrolled in the graph, so a shorter one traces faster (default: {MAX_CHAIN})")
    p.add_argument("--out", required=True, help="directory for allreduce.csv and bench.json")
    add_quiet(p)
    p.set_defaults(func=bench_allreduce)

    p = bench_sub.add_parser("input", help="input pipeline alone: images/sec, cold (files into memory) and warm",
                             description="Pull the training input pipeline (engine.feed + data.pipeline) through "
                                         "the strategy with no model: images/sec of the cold read (files decoded "
                                         "into memory) and of training epochs served from memory, in the run's "
                                         "data placement (--data-placement). "
                                         "Compare with a run's images_per_sec to see whether input can starve "
                                         "training.")
    p.add_argument("--seconds", type=float, default=10.0, metavar="S",
                   help="measure warm epochs for about S seconds; the cold epoch is always whole (default: 10)")
    p.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the decoded split in memory; --no-cache reads the files again before every warm "
                        "epoch (how fast the cold path streams; default: --cache)")
    p.add_argument("--compare", metavar="RUN_DIR", help="also print the ratio to the images/sec this training "
                                                        "run consumed (its summary.json)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_config_options(p, skip=NOT_INPUT_OPTIONS)
    p.set_defaults(func=bench_input)


# RunConfig fields that do not change what the input pipeline does: not offered by `bench input`.
NOT_INPUT_OPTIONS = ("base_lr", "base_batch", "lr_rule", "warmup_epochs", "schedule", "optimizer", "weight_decay",
                      "epochs", "steps", "model", "precision", "jit", "steps_per_loop", "deterministic",
                      "checkpoint_every", "eval_every_epoch", "timing_warmup_steps", "divergence_factor", "measure",
                      "measure_budget", "noise_scale")


def bench_allreduce(args) -> int:
    from ..measure.allreduce import bench as allreduce_bench

    frame = allreduce_bench.bench(args.replicas, args.sizes, args.impl, repeats=args.repeats, warmup=args.warmup,
                            models=args.models, image_size=args.image_size, num_classes=args.num_classes,
                            max_chain=args.max_chain, out=args.out, quiet=args.quiet, dtypes=args.dtype)
    ok = frame[frame["status"] == "ok"]
    for (impl, dtype), rows in ok.groupby(["impl", "dtype"], sort=False):
        best = rows.loc[rows["busbw_GBps"].idxmax()]
        print(f"{impl:18s} {dtype:8s} peak busbw {best['busbw_GBps']:8.3f} GB/s at {int(best['size_bytes'])} bytes")
    for _, row in frame[frame["status"] != "ok"].iterrows():
        what = f" {row['payload']} {int(row['size_bytes'])} bytes" if row["payload"] else ""
        print(f"{row['impl']:18s} {row['dtype']:8s}{what} {row['status']}: {row['reason']}")
    print(f"written: {args.out}/allreduce.csv")
    return 0


def bench_input(args) -> int:
    import json

    from .. import fileio
    from ..errors import RunDirError
    from ..measure.input import bench as inputbench

    result = inputbench.measure(config_from_args(args), seconds=args.seconds, cache=args.cache)
    if args.compare:
        summary = os.path.join(args.compare, "summary.json")
        if not os.path.exists(summary):
            raise RunDirError(f"--compare {args.compare}: no summary.json there; give a finished run directory")
        consumed = fileio.read_json(summary).get("images_per_sec")
        result["training_images_per_sec"] = consumed
        result["cold_ratio"] = result["cold_images_per_sec"] / consumed if consumed else None
        result["warm_ratio"] = result["warm_images_per_sec"] / consumed if consumed else None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(inputbench.format_result(result))
    if args.compare and result["cold_ratio"]:
        print(f"vs training          {result['training_images_per_sec']:10.0f} images/sec ({args.compare}): "
              f"cold {result['cold_ratio']:.1f}x, warm {result['warm_ratio']:.1f}x")
    return 0
