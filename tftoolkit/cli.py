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
    _add_data_parsers(sub)
    return parser


def _add_bench_parsers(bench_sub) -> None:
    """Register `tftoolkit bench` sub-commands (one block each)."""
    p = bench_sub.add_parser("input", help="input pipeline alone: images/sec, cold (from files) and warm (cached)",
                             description="Pull the training input pipeline (data.train_dataset + distribute) through "
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
    from . import shapes

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
    from .datasets import default_dir

    return str(default_dir())


def cmd_bench_input(args) -> int:
    import json

    from . import inputbench, rundir
    from .errors import RunDirError

    result = inputbench.measure(config_from_args(args), seconds=args.seconds, cache=args.cache)
    if args.compare:
        summary = os.path.join(args.compare, "summary.json")
        if not os.path.exists(summary):
            raise RunDirError(f"--compare {args.compare}: no summary.json there; give a finished run directory")
        consumed = rundir.read_json(summary).get("images_per_sec")
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
    from . import shapes

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
