"""tftoolkit launch: K worker processes here, or each host's TF_CONFIG."""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from .common import config_from_args


def add(sub) -> None:
    from ..cluster.spec import DEFAULT_JOIN_TIMEOUT_S

    p = sub.add_parser("launch", help="run a train command as K worker processes here (MultiWorkerMirroredStrategy)",
                       description="Start K workers of `tftoolkit train` on this machine (free localhost ports, "
                                   "worker 0 is the chief and writes the run directory), stream their output with a "
                                   "[worker k] prefix. Exit code: the chief's when every worker ends on its own; "
                                   "if one fails first, the others are stopped and the exit code is the failed "
                                   "worker's (128 + N when signal N killed it: 137 after SIGKILL). With "
                                   "--print-tf-config, print each host's TF_CONFIG instead.",
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
    p.set_defaults(func=run)


def train_command(argv: list[str]):
    """The training command after ``--``, checked and parsed: (argv starting with "train", RunConfig)."""
    from . import build_parser

    argv = list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if argv[:1] != ["train"]:
        raise ConfigError("give the training command after --, e.g. tftoolkit launch --workers 2 -- train --out "
                          f"runs/mw (got {' '.join(argv) or 'nothing'})")
    args = build_parser().parse_args(argv)  # a bad train option is the usual one-line usage error
    return argv, config_from_args(args)


def run(args) -> int:
    import sys

    from ..cluster import launch

    if args.print_tf_config:
        print(launch.tf_config_lines(args.print_tf_config, args.workers, args.base_port), end="")
        return 0
    if args.workers is None:
        raise ConfigError("launch needs --workers K (or --print-tf-config HOSTS); see tftoolkit launch --help")
    argv, config = train_command(args.command_args)
    launch.stop_on_sigterm()
    return launch.launch(argv, config, args.workers, args.replicas_per_worker, args.join_timeout, args.base_port,
                         out=sys.stdout, err=sys.stderr)
