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
    return parser


def _add_bench_parsers(bench_sub) -> None:
    """Register `tftoolkit bench` sub-commands (one block each)."""


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
