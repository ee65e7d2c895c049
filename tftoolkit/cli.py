"""Command line: ``tftoolkit <command> [options]`` (also ``python -m tftoolkit``).

The CLI holds no logic of its own: each command parses its options and calls the same function the
Python API and the notebooks call. Errors a user can fix (ToolkitError) become one line on stderr and
exit code 2; set TFTOOLKIT_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing

from .config import RunConfig, cli_fields, field_types
from .errors import ConfigError, ToolkitError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong and where to look), exit code 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,2,5, got {text!r}") from None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One option per RunConfig field, with the field's help text, type and choices."""
    hints = field_types()
    group = parser.add_argument_group("training options (RunConfig fields)")
    for f in cli_fields():
        if f.name in skip:
            continue
        tp = hints[f.name]
        args = typing.get_args(tp)
        base = next((a for a in args if a is not type(None)), tp)
        default = f.default
        help_text = f.metadata["help"] + (f" (default: {default})" if default is not None else "")
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(base) is list:
            kw["type"] = _int_list
            kw["metavar"] = "I,J,..."
        else:
            kw["type"] = base
            if f.metadata.get("choices"):
                kw["choices"] = f.metadata["choices"]
            else:
                kw["metavar"] = base.__name__.upper()
        group.add_argument(_flag(f.name), **kw)


def config_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> RunConfig:
    names = {f.name for f in dataclasses.fields(RunConfig)} - set(skip)
    return RunConfig.from_dict({k: v for k, v in vars(args).items() if k in names})


# --- commands ------------------------------------------------------------------------------------
def cmd_train(args) -> int:
    from .train import train

    summary = train(config_from_args(args), args.out, force=args.force, quiet=args.quiet)
    print(f"{args.out}/summary.json: status {summary['status']}"
          + (f" ({summary['error']})" if summary.get("error") else ""))
    return 0 if summary["status"] == "ok" else 1


def cmd_env(args) -> int:
    from . import hardware

    return hardware.env_main(as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tftoolkit", description="Measure and tune multi-GPU data-parallel training with TensorFlow.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("train", help="train data-parallel and write a run directory",
                       description="Train a model data-parallel with MirroredStrategy (N GPUs, or N simulated CPU "
                                   "replicas) and write config.json, summary.json and steps.csv into --out.")
    p.add_argument("--out", required=True, help="run directory; rerunning the same config there resumes it")
    p.add_argument("--force", action="store_true", help="overwrite --out even if it holds a different run")
    p.add_argument("--quiet", action="store_true", help="no progress bar and only warnings")
    add_config_options(p)
    p.set_defaults(func=cmd_train)
    _add_multiworker_parsers(sub)

    p = sub.add_parser("env", help="hardware and software report (GPUs, interconnect topology, TensorFlow build)",
                       description="Report Python, TensorFlow build, CPU, memory, GPUs and their interconnect topology.")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=cmd_env)

    # `tftoolkit bench <what>`: micro-benchmarks (input pipeline, all-reduce). Each adds its own sub-parser here.
    bench = sub.add_parser("bench", help="micro-benchmarks: input pipeline, all-reduce bandwidth",
                           description="Measure one part of the system alone.")
    bench_sub = bench.add_subparsers(dest="bench", metavar="WHAT", parser_class=_Parser)
    bench_sub.required = True
    _add_bench_parsers(bench_sub)
    _add_workflow_parsers(sub)
    _add_data_parsers(sub)
    _add_batch_science_parsers(sub)
    _add_measure_parsers(sub)
    return parser


def _add_bench_parsers(bench_sub) -> None:
    """Register `tftoolkit bench` sub-commands (one block each)."""
    from .allreduce import DEFAULT_MODELS, DEFAULT_SIZES, IMPLS

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
    p.add_argument("--repeats", type=int, default=10, help="timed calls per size; the median is reported (default: 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first (tracing, allocation) (default: 2)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="also all-reduce these models' gradient sets, as the training step does; 'none' to skip "
                        f"(default: {','.join(DEFAULT_MODELS)})")
    p.add_argument("--image-size", type=int, default=32, help="input side for building --models (default: 32)")
    p.add_argument("--num-classes", type=int, default=10, help="classes for building --models (default: 10)")
    p.add_argument("--out", required=True, help="directory for allreduce.csv and bench.json")
    p.add_argument("--quiet", action="store_true", help="only warnings")
    p.set_defaults(func=cmd_bench_allreduce)

    p = bench_sub.add_parser("input", help="input pipeline alone: images/sec, cold (from files) and warm (cached)",
                             description="Pull the training input pipeline (data.pipeline.train_dataset + distribute) through "
                                         "the strategy with no model: images/sec for the first epoch (read and "
                                         "decoded from the files) and for later ones (served from the cache). "
                                         "Compare with a run's images_per_sec to see whether input can starve "
                                         "training.")
    p.add_argument("--seconds", type=float, default=10.0, metavar="S",
                   help="measure warm epochs for about S seconds; the cold epoch is always whole (default: 10)")
    p.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                   help="cache decoded examples in memory after the first epoch; --no-cache re-reads the files "
                        "every epoch (default: --cache)")
    p.add_argument("--compare", metavar="RUN_DIR", help="also print the ratio to the images/sec this training "
                                                        "run consumed (its summary.json)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_config_options(p, skip=_NOT_INPUT_OPTIONS)
    p.set_defaults(func=cmd_bench_input)


# --- data: shapes16k, image folders, TFRecords, the input pipeline (issue 3) -------------------------------
# RunConfig fields that do not change what the input pipeline does: not offered by `bench input`.
_NOT_INPUT_OPTIONS = ("base_lr", "base_batch", "lr_rule", "warmup_epochs", "schedule", "optimizer", "weight_decay",
                      "epochs", "steps", "model", "precision", "jit", "steps_per_loop", "deterministic",
                      "checkpoint_every", "eval_every_epoch", "timing_warmup_steps", "divergence_factor", "measure",
                      "noise_scale")

def cmd_data_prepare(args) -> int:
    from .data import shapes

    m = shapes.prepare(args.out, images=args.images, val_images=args.val_images, size=args.size, seed=args.seed,
                       shard_size=args.shard_size, force=args.force)
    splits = m["splits"]
    out = args.out or _default_data_dir()
    print(f"{out}: shapes16k, {splits['train']['examples']} train images in {len(splits['train']['shards'])} "
          f"shard(s)" + (f", {splits['val']['examples']} val images in {len(splits['val']['shards'])} shard(s)"
                         if "val" in splits else "") + f", {m['image_shape'][0]}x{m['image_shape'][1]} RGB, "
          f"{m['num_classes']} classes; manifest.json")
    return 0


def _default_data_dir() -> str:
    from .data.home import default_dir

    return str(default_dir())


def cmd_bench_input(args) -> int:
    import json

    from . import fileio, inputbench
    from .errors import RunDirError

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


def _add_data_parsers(sub) -> None:
    from .data import shapes

    data = sub.add_parser("data", help="prepare datasets (shapes16k)",
                          description="Make the datasets the toolkit trains on.")
    data_sub = data.add_subparsers(dest="data", metavar="WHAT", parser_class=_Parser)
    data_sub.required = True
    p = data_sub.add_parser("prepare", help="render shapes16k into TFRecord shards + manifest.json",
                            description="Render shapes16k: 10 balanced classes of geometric shapes (RGB, random "
                                        "position, scale, rotation, colours, background, clutter and noise), the "
                                        "same bytes for the same seed. Writes TFRecord shards and manifest.json "
                                        "(see data/README.md). Does nothing if --out already holds the same "
                                        "dataset, verified.")
    p.add_argument("--out", default=None, help="folder to write (default: data/shapes16k, or "
                                               "$TFTOOLKIT_DATA_DIR/shapes16k when that is set)")
    p.add_argument("--images", type=int, default=16000, help="training images (default: 16000)")
    p.add_argument("--val-images", type=int, default=4000, help="validation images (default: 4000)")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (default: 32)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives byte-identical files "
                                                       "(default: 0)")
    p.add_argument("--shard-size", type=int, default=shapes.SHARD_SIZE,
                   help=f"images per TFRecord shard (default: {shapes.SHARD_SIZE}, i.e. 16 training shards)")
    p.add_argument("--force", action="store_true", help="render again even if --out already holds this dataset")
    p.set_defaults(func=cmd_data_prepare)


# --- measurement: scaling study and all-reduce bandwidth (issue 4) --------------------------------------------
def cmd_bench_allreduce(args) -> int:
    from . import allreduce

    frame = allreduce.bench(args.replicas, args.sizes, args.impl, repeats=args.repeats, warmup=args.warmup,
                            models=args.models, image_size=args.image_size, num_classes=args.num_classes,
                            out=args.out, quiet=args.quiet)
    ok = frame[frame["status"] == "ok"]
    for impl, rows in ok.groupby("impl", sort=False):
        best = rows.loc[rows["busbw_GBps"].idxmax()]
        print(f"{impl:18s} peak busbw {best['busbw_GBps']:8.3f} GB/s at {int(best['size_bytes'])} bytes")
    for _, row in frame[frame["status"] != "ok"].iterrows():
        print(f"{row['impl']:18s} {row['status']}: {row['reason']}")
    print(f"written: {args.out}/allreduce.csv")
    return 0


def cmd_scale(args) -> int:
    from . import scale

    frame = scale.scale(config_from_args(args, skip=("replicas", "gpus")), args.replicas, args.out, args.mode,
                        force=args.force, quiet=args.quiet)
    cols = ["replicas", "global_batch", "images_per_sec", "speedup", "efficiency", "communication_fraction", "status"]
    print(frame[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"written: {args.out}/scaling.csv (speedup and efficiency relative to "
          f"{int(frame['baseline_replicas'].iloc[0])} replica(s))")
    return 0 if (frame["status"] == "ok").all() else 1


def _add_measure_parsers(sub) -> None:
    from .scale import MODES

    p = sub.add_parser("scale", help="train at several replica counts; speedup and efficiency table",
                       description="Run the same training at each replica count (OUT/runs/r<N>/) and write "
                                   "OUT/scaling.csv: throughput, speedup and efficiency relative to the smallest "
                                   "count, and each run's compute / all-reduce / input-wait breakdown.")
    p.add_argument("--replicas", required=True, metavar="N,M,...",
                   help="replica counts, e.g. 1,2,4 (each once, all >= 1)")
    p.add_argument("--mode", choices=MODES, default="weak",
                   help="weak: keep the per-replica batch; strong: keep the global batch (--global-batch, or "
                        "--per-replica-batch x the smallest count) (default: weak)")
    p.add_argument("--out", required=True, help="study folder; rerunning the same study there reuses finished runs")
    p.add_argument("--force", action="store_true", help="overwrite run folders that hold a different run")
    p.add_argument("--quiet", action="store_true", help="no progress bars and only warnings")
    add_config_options(p, skip=("replicas", "gpus"))
    p.set_defaults(func=cmd_scale)


# --- batch science: noise-scale advice, LR and batch finders, the scaling model (issue 6) ------------------
def cmd_advise(args) -> int:
    from . import advise

    result = advise.advise(args.run_dir, args.out, per_replica_batch=args.per_replica_batch,
                           max_replicas=args.max_replicas, interconnect=args.interconnect, inter_host=args.inter_host)
    print(advise.describe(result))
    print(f"written: {args.out or args.run_dir}/advice.json, tradeoff.csv, tradeoff.png")
    return 0


def cmd_find_lr(args) -> int:
    from . import finders

    r = finders.find_lr(config_from_args(args), args.out, lr_min=args.lr_min, lr_max=args.lr_max, steps=args.lr_steps,
                        blowup=args.blowup, quiet=args.quiet)
    if r["suggested_lr"] == r["suggested_lr"]:
        print(f"suggested LR {r['suggested_lr']:.4g} for global batch {r['global_batch']} ({r['suggestion']}); "
              f"as --base-lr under the {r['lr_rule']} rule: {r['suggested_base_lr']:.4g}; {r['stop_reason']}")
    else:
        print(f"no LR suggested: {r['suggestion']}; {r['stop_reason']}")
    print(f"written: {args.out}/lr_find.csv, lr_find.json, lr_find.png")
    return 0


def cmd_find_batch(args) -> int:
    from . import finders

    r = finders.find_batch(config_from_args(args), args.out, memory_limit_mb=args.memory_limit_mb,
                           max_batch=args.max_batch, quiet=args.quiet)
    print(f"largest per-replica batch that fits: {r['max_per_replica_batch']}"
          f"{' (the --max-batch cap)' if r['capped_at_max_batch'] else ''}; global batch "
          f"{r['max_global_batch']} on {r['replicas']} replica(s); criterion: {r['criterion']}")
    print(f"written: {args.out}/batch_find.csv, batch_find.json, batch_find.png")
    return 0


def cmd_predict(args) -> int:
    from . import predict

    result = predict.run(args.run_dir, args.out, interconnects=args.interconnect, inter_host=args.inter_host,
                         allreduce_csv=args.allreduce_csv, impl=args.impl, mode=args.mode, devices=args.devices,
                         overlap=args.overlap, max_replicas=args.max_replicas, gpus_per_host=args.gpus_per_host,
                         nics_per_host=args.nics_per_host, measured=args.measured, algorithm=args.algorithm)
    print(predict.describe(result))
    print(f"written: {args.out or args.run_dir}/prediction.csv, prediction.json, efficiency_vs_replicas.png")
    return 0


def _add_batch_science_parsers(sub) -> None:
    from . import finders, predict

    p = sub.add_parser("advise", help="recommend a global batch and GPU count from a run's measured noise scale",
                       description="Turn the gradient noise scale of a run trained with --noise-scale into a "
                                   "recommended global batch and GPU count (B_crit ~ B_simple, McCandlish et al. "
                                   "2018) and plot the steps-vs-examples trade-off.")
    p.add_argument("run_dir", help="run directory of a run trained with --noise-scale")
    p.add_argument("--out", help="where to write advice.json, tradeoff.csv, tradeoff.png (default: RUN_DIR)")
    p.add_argument("--per-replica-batch", type=int, help="per-replica batch to plan with (default: the run's; "
                                                         "e.g. what find-batch found)")
    p.add_argument("--max-replicas", type=int, default=64, help="most GPUs to consider (default: 64)")
    p.add_argument("--interconnect", help="also predict time to the same loss over this link: "
                                          + ", ".join(predict.PRESETS) + " or NAME=GBps[:latency_us]")
    p.add_argument("--inter-host", default="ib200", help="link between hosts for the time prediction (default: ib200)")
    p.set_defaults(func=cmd_advise)

    for name, fn, helptext in (("find-lr", cmd_find_lr, "exponential learning-rate sweep under the strategy"),
                               ("find-batch", cmd_find_batch, "largest per-replica batch that fits in device memory")):
        p = sub.add_parser(name, help=helptext, description=helptext + " (see tftoolkit.finders).")
        p.add_argument("--out", required=True, help="directory for the finder's table, JSON and figure")
        p.add_argument("--quiet", action="store_true", help="only warnings")
        if name == "find-lr":
            p.add_argument("--lr-min", type=float, default=finders.LR_MIN, help=f"first LR (default: {finders.LR_MIN:g})")
            p.add_argument("--lr-max", type=float, default=finders.LR_MAX, help=f"last LR (default: {finders.LR_MAX:g})")
            p.add_argument("--lr-steps", type=int, default=finders.LR_STEPS,
                           help=f"steps of the sweep (default: {finders.LR_STEPS})")
            p.add_argument("--blowup", type=float, default=finders.BLOWUP,
                           help=f"stop when the smoothed loss exceeds this multiple of its minimum (default: {finders.BLOWUP:g})")
        else:
            p.add_argument("--memory-limit-mb", type=float,
                           help="memory per replica in MiB; required on CPU replicas, where a batch fits while its "
                                "estimated training memory stays under it; on GPUs an extra cap on the measured peak")
            p.add_argument("--max-batch", type=int, default=finders.MAX_BATCH,
                           help=f"stop doubling here (default: {finders.MAX_BATCH})")
        add_config_options(p)
        p.set_defaults(func=fn)

    p = sub.add_parser("predict", help="predict speedup and efficiency for 1..64 GPUs from a measured run",
                       description="Scaling model: step time = compute + ring all-reduce(gradient bytes, N) - overlap, "
                                   "calibrated from a run directory and an allreduce.csv or link presets "
                                   "(see tftoolkit.predict for the figures and their sources).")
    p.add_argument("run_dir", help="measured run directory (summary.json with compute_time_s or a 1-replica step_time_s)")
    p.add_argument("--out", help="where to write prediction.csv/json and figures (default: RUN_DIR)")
    p.add_argument("--interconnect", help="comma-separated links inside a host: " + ", ".join(predict.PRESETS)
                                          + " or NAME=GBps[:latency_us] (default: all intra-host presets, or none "
                                            "with --allreduce-csv)")
    p.add_argument("--inter-host", default="ib200", help="link between hosts (default: ib200)")
    p.add_argument("--allreduce-csv", nargs="+", help="allreduce.csv file(s) or their directories from `tftoolkit "
                                                      "bench allreduce`: fit bandwidth and latency to them")
    p.add_argument("--impl", help="all-reduce implementation to fit in the CSV (default: the fastest)")
    p.add_argument("--mode", choices=predict.MODES, default="weak",
                   help="weak: keep the per-replica batch; strong: keep the global batch (default: weak)")
    p.add_argument("--devices", choices=predict.DEVICES, default="dedicated",
                   help="dedicated: one device per replica (GPUs); shared: replicas share the host's cores "
                        "(CPU-simulated replicas) (default: dedicated)")
    p.add_argument("--overlap", type=float, default=0.0, help="fraction of the all-reduce hidden behind the "
                                                              "backward pass (default: 0, as this toolkit's step)")
    p.add_argument("--max-replicas", type=int, default=predict.DEFAULT_MAX_REPLICAS, help="default: 64")
    p.add_argument("--gpus-per-host", type=int, default=predict.DEFAULT_GPUS_PER_HOST, help="default: 8")
    p.add_argument("--nics-per-host", type=int, default=1, help="NICs per host for the inter-host link (default: 1)")
    p.add_argument("--measured", nargs="+", help="run directories or scaling.csv to compare the prediction with")
    p.add_argument("--algorithm", choices=tuple(predict.ALGORITHMS), default="ring",
                   help="all-reduce inside a host: ring (NCCL) or star (reduce_to_one: CPU replicas, GPUs without "
                        "NCCL) (default: ring)")
    p.set_defaults(func=cmd_predict)


# --- several workers: tftoolkit launch (issue 7) --------------------------------------------------------
def _add_multiworker_parsers(sub) -> None:
    from .multiworker import DEFAULT_JOIN_TIMEOUT_S

    p = sub.add_parser("launch", help="run a train command as K worker processes here (MultiWorkerMirroredStrategy)",
                       description="Start K workers of `tftoolkit train` on this machine (free localhost ports, "
                                   "worker 0 is the chief and writes the run directory), stream their output with a "
                                   "[worker k] prefix and return the chief's exit code. If one worker fails the "
                                   "others are stopped. With --print-tf-config, print each host's TF_CONFIG instead.",
                       usage="tftoolkit launch --workers K [--replicas-per-worker N] [--join-timeout S] "
                             "[--base-port P] -- train [train options] --out RUN_DIR")
    p.add_argument("--workers", type=int, metavar="K", help="worker processes to start")
    p.add_argument("--replicas-per-worker", type=int, metavar="N",
                   help="replicas each worker runs (simulated CPU devices, or its own GPUs); default: the train "
                        "options' --replicas / K, else an equal share of the GPUs, else 1")
    p.add_argument("--join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S, metavar="S",
                   help=f"fail if the workers have not all joined after S seconds (default: {DEFAULT_JOIN_TIMEOUT_S:g})")
    p.add_argument("--base-port", type=int, metavar="P", help="use ports P..P+K-1 (default: free ports the OS picks)")
    p.add_argument("--print-tf-config", metavar="HOSTS",
                   help="print the TF_CONFIG for each of HOSTS (host or host:port, comma-separated; the first is "
                        "the chief) and start nothing")
    p.add_argument("command_args", nargs=argparse.REMAINDER, metavar="-- train ...",
                   help="the training command, after --")
    p.set_defaults(func=cmd_launch)


def cmd_launch(args) -> int:
    from . import launch

    if args.print_tf_config:
        return launch.print_tf_configs(args.print_tf_config, args.workers, args.base_port)
    if args.workers is None:
        raise ConfigError("launch needs --workers K (or --print-tf-config HOSTS); see tftoolkit launch --help")
    launch.stop_on_sigterm()
    return launch.launch(args.command_args, args.workers, args.replicas_per_worker, args.join_timeout, args.base_port)


# --- workflow: notebook sweeps and the demo (issue 5) ---------------------------------------------------
def cmd_sweep(args) -> int:
    from . import sweep

    return sweep.main_cli(args)


def cmd_demo(args) -> int:
    from . import demo

    return demo.main_cli(args)


def _add_workflow_parsers(sub) -> None:
    p = sub.add_parser("sweep", help="run a notebook over a parameter grid with papermill (resumable)",
                       description="Run SPEC's notebook once per point of its parameter grid (grid: crossed, zip: "
                                   "paired, fixed: shared), each point in its own process and folder "
                                   "OUT/runs/<id>/; write OUT/results.csv and the report (OUT/report.html). "
                                   "Running the same command again resumes: finished points are skipped.")
    p.add_argument("spec", metavar="SPEC.yaml", help="sweep spec: notebook, report, fixed, grid, zip (see sweeps/)")
    p.add_argument("--out", required=True, help="sweep folder; rerunning the same spec there resumes it")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="stop a point after S seconds and record it as 'timeout' (default: no limit)")
    p.add_argument("--rerun-failed", action="store_true", help="also run failed and timed-out points again")
    p.add_argument("--dry-run", action="store_true", help="list the points and what would run; run nothing")
    p.add_argument("--force", action="store_true", help="delete a different sweep found in --out and start over")
    p.add_argument("--gpus-per-run", type=int, default=None, metavar="K",
                   help="give each point K GPUs (CUDA_VISIBLE_DEVICES) and run as many points at once as there "
                        "are disjoint sets of K; without GPUs points run one after another")
    p.add_argument("--no-report", action="store_true", help="skip the report notebook")
    p.add_argument("--quiet", action="store_true", help="no progress bar and only warnings")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("demo", help="the main job: data, scaling and batch/LR sweeps, report (about 10 min on CPU)",
                       description="Prepare shapes16k if needed, run the scaling sweep (all GPUs, or 4 simulated CPU "
                                   "replicas), a small batch-size x LR-rule sweep and a short all-reduce bench, render "
                                   "the report and print where report.html is. Running it again resumes.")
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--force", action="store_true", help="redo a sweep in --out whose spec (sweeps/*.yaml) changed")
    p.add_argument("--quiet", action="store_true", help="only warnings and the final lines")
    p.set_defaults(func=cmd_demo)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ToolkitError as e:
        print(f"tftoolkit {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"tftoolkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a traceback in front of a user is a bug; keep it one line
        if os.environ.get("TFTOOLKIT_DEBUG"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"tftoolkit {args.command}: failed: {type(e).__name__}: {first} "
              "(set TFTOOLKIT_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


__all__ = ["main", "build_parser", "add_config_options", "config_from_args", "ConfigError"]
