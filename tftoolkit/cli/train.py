"""tftoolkit train."""

from __future__ import annotations

from .common import CONFIG_FILE_HELP, QUIET_HELP, add_config_options, config_from_args
from .sections import OUTPUT


def add(sub) -> None:
    p = sub.add_parser("train", help="train data-parallel and write a run directory",
                       description="Train a model data-parallel with MirroredStrategy (N GPUs, or N simulated CPU "
                                   "replicas) and write config.json, summary.json and steps.csv into --out. "
                                   "Ctrl-C or SIGTERM (timeout, scancel, a Slurm time limit) stops it as "
                                   "interrupted, summary written; SIGTERM first checkpoints the steps trained. Exit "
                                   "code 0 ok, 1 failed or diverged, 2 a mistake to fix, 130 Ctrl-C, 143 SIGTERM.")
    out = add_config_options(p)[OUTPUT]
    out.add_argument("--out", required=True, help="run directory; rerunning the same config there resumes it")
    out.add_argument("--force", action="store_true", help="overwrite --out even if it holds a different run (a run "
                     "directory only: a folder of other files is never deleted)")
    out.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    out.add_argument("--config", dest="config_file", metavar="FILE", help=CONFIG_FILE_HELP)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..cluster.spec import cluster_from_env
    from ..training import train

    summary = train(config_from_args(args), args.out, force=args.force, quiet=args.quiet)  # SIGTERM: cli.main
    cluster = cluster_from_env()
    if cluster is None or cluster.is_chief:  # the chief speaks for a multi-worker run (it wrote the summary)
        print(f"{args.out}/summary.json: status {summary['status']}"
              + (f" ({summary['error']})" if summary.get("error") else ""))
    return 0 if summary["status"] == "ok" else 1
