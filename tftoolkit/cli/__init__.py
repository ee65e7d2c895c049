"""Command line: ``tftoolkit <command> [options]`` (also ``python -m tftoolkit``).

The CLI parses options, calls the same function the Python API and the notebooks call, and prints what
the command has to say; it holds no other logic, and nothing imports it. One module per thing a user does:

    train        train                      measure      env, scale, bench allreduce | input
    data         data prepare               experiments  sweep, demo
    science      find-lr, find-batch, advise, predict    cluster  launch

Errors a user can fix (ToolkitError) become one line on stderr and exit code 2; set TFTOOLKIT_DEBUG=1 to
see tracebacks.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ToolkitError
from . import cluster, data, experiments, measure, science, train
from .common import EXIT_USAGE, Parser, add_config_options, config_from_args, subcommands


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tftoolkit", description="Measure and tune multi-GPU data-parallel training with TensorFlow.")
    sub = subcommands(parser, "command")
    # In the order a user meets them: train; its data; measure it; sweep it; tune batch and LR; more hosts.
    for group in (train, data, measure, experiments, science, cluster):
        group.add(sub)
    return parser


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


__all__ = ["main", "build_parser", "add_config_options", "config_from_args"]
