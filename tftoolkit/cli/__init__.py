"""Command line: ``tftoolkit <command> [options]`` (also ``python -m tftoolkit``).

The CLI parses options, calls the same function the Python API and the notebooks call, and prints what
the command has to say; it holds no other logic, and nothing imports it. One module per thing a user does:

    train    train                          measure      env, doctor, scale, bench allreduce | input
    data     data prepare                   experiments  sweep, demo, tensorboard
    tuning   find-lr, find-batch, advise    cluster      launch, data-service
    predict  predict (its options declared as data: they fill the forecast's inputs)

Errors a user can fix (ToolkitError) become one line on stderr and exit code 2; set TFTOOLKIT_DEBUG=1 to
see tracebacks.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading

import importlib

from ..errors import ToolkitError, out_of_memory
from .common import EXIT_USAGE, Parser, add_config_options, config_from_args, subcommands

# Every command with the CLI module that builds its options and its one-line help, in the order a user meets them:
# train; its data; measure it; sweep it; tune batch and LR; more hosts. `tftoolkit --help` is printed from this
# table alone, and a command builds only its own module's parsers, so no help imports what a command runs (pandas,
# notebooks, TensorFlow). tests/cli/test_cli.py holds each line equal to the one its module registers.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train", "train data-parallel and write a run directory"),
    "data": ("data", "prepare datasets (shapes16k)"),
    "env": ("measure", "hardware and software report (GPUs, interconnect topology, TensorFlow build)"),
    "doctor": ("measure", "check that the toolkit's assumptions hold on this machine (run first on a new GPU server)"),
    "scale": ("measure", "train at several replica counts; speedup and efficiency table"),
    "bench": ("measure", "micro-benchmarks: input pipeline, all-reduce bandwidth"),
    "sweep": ("experiments", "run a notebook over a parameter grid with papermill (resumable)"),
    "demo": ("experiments", "the main job: data, scaling and batch/LR sweeps, report (about 7 minutes on 2 CPU cores)"),
    "tensorboard": ("experiments", "open TensorBoard on a run or a sweep (scalars, HParams, profiler traces)"),
    "advise": ("tuning", "recommend a global batch and GPU count from a run's measured noise scale"),
    "find-lr": ("tuning", "exponential learning-rate sweep under the strategy"),
    "find-batch": ("tuning", "largest per-replica batch that fits in device memory"),
    "predict": ("predict", "forecast throughput, speedup and efficiency on N GPUs, from a measured run or from the "
                           "model and the catalogue's hardware"),
    "launch": ("cluster", "run a train command as K worker processes here (MultiWorkerMirroredStrategy)"),
    "data-service": ("cluster", "a tf.data service to run the input pipeline on more cores or hosts"),
}
ALL = "*"


def build_parser(command: str | None = ALL) -> argparse.ArgumentParser:
    """The parser with every command's options (``command=ALL``: docs, tests, ``launch``), or with only
    ``command``'s module built and the other commands listed by name and help (None: the top level alone)."""
    parser = Parser(prog="tftoolkit", description="Measure and tune multi-GPU data-parallel training with TensorFlow.")
    sub = subcommands(parser, "command")
    built: set[str] = set()
    for name, (module, helptext) in COMMANDS.items():
        if command == ALL or COMMANDS.get(command, ("",))[0] == module:
            if module not in built:  # a module adds all of its commands at once, in the table's order
                built.add(module)
                importlib.import_module(f"{__name__}.{module}").add(sub)
        else:
            sub.add_parser(name, help=helptext)
    return parser


def command_of(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the command whose --help lists what it takes, not the top level's
        where = f"tftoolkit {args.command}" if getattr(args, "command", None) else "tftoolkit"
        parser.exit(EXIT_USAGE, f"{where}: error: unrecognized arguments: {' '.join(extra)} (see {where} --help)\n")
    if isinstance(getattr(args, "out", None), str) and not args.out.strip():
        # Every command that writes refuses an empty --out (an unset shell variable): "" is the working folder.
        print(f"tftoolkit {args.command}: error: --out is empty (an unset variable?); give a folder's path",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        # Every command takes SIGTERM (timeout, scancel, a Slurm time limit) as Ctrl-C: its clean-up runs, and the
        # exit code below says which signal (the rule: training/signals.py, which imports nothing of the toolkit).
        from ..training.signals import stop_on_sigterm

        with stop_on_sigterm():
            return args.func(args)
    except ToolkitError as e:
        print(f"tftoolkit {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        # 128 + the signal, as a shell reports a process the signal ended: 130 for Ctrl-C, 143 for SIGTERM.
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"tftoolkit {args.command}: interrupted" + (" (SIGTERM)" if signum == signal.SIGTERM else ""),
              file=sys.stderr)
        return 128 + int(signum)
    except Exception as e:  # noqa: BLE001 - a traceback in front of a user is a bug; keep it one line
        if os.environ.get("TFTOOLKIT_DEBUG"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        line = out_of_memory(e) or f"{type(e).__name__}: {first}"
        print(f"tftoolkit {args.command}: failed: {line} (set TFTOOLKIT_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def run() -> None:
    """The ``tftoolkit`` command (the console script and ``python -m tftoolkit``): main(), then exit at once.

    By the time main() returns, every file a command writes is closed. What a normal exit still does after that
    is take the interpreter apart, and with TensorFlow loaded that means freeing ~400,000 objects and its
    thread pools one by one: 1.2 s of wall time after every ``tftoolkit train`` here (0.06 s without), paid again
    by each worker of a launch and each point of a Slurm array. So this exit does what matters of a normal one
    (joins the threads still working, runs the atexit handlers, which flush logging, flushes stdout and stderr)
    and skips the teardown. An exception out of main() (TFTOOLKIT_DEBUG=1) still exits the normal way, with its
    traceback.
    """
    from ..experiments.startup import skip_slow_format_checkers

    skip_slow_format_checkers()  # ~1.2 s less for every command that reads a notebook (sweep, report, demo)
    code = main()
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    # What SystemExit(code) would exit with: None is 0, an int itself, anything else 1.
    os._exit(0 if code is None else code if isinstance(code, int) else 1)


__all__ = ["main", "run", "build_parser", "add_config_options", "config_from_args"]
