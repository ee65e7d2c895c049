"""tftoolkit sweep and demo: notebooks over parameter grids, and the main job."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SweepError
from .common import add_quiet


def add(sub) -> None:
    p = sub.add_parser("sweep", help="run a notebook over a parameter grid with papermill (resumable)",
                       description="Run SPEC's notebook once per point of its parameter grid (grid: crossed, zip: "
                                   "paired, fixed: shared), each point in its own process and folder "
                                   "OUT/runs/<id>/; write OUT/results.csv and the report (OUT/report.html). "
                                   "Running the same command again resumes: finished points are skipped. Exit code "
                                   "1 when a point this command ran failed, timed out or was cancelled, or the report "
                                   "failed; failures kept from an earlier run are listed, not counted again.")
    p.add_argument("spec", metavar="SPEC.yaml", help="sweep spec: notebook, report, fixed, grid, zip (see sweeps/)")
    p.add_argument("--out", required=True, help="sweep folder; rerunning the same spec there resumes it")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="stop a point after S seconds and record it as 'timeout' (default: no limit)")
    p.add_argument("--rerun-failed", action="store_true", help="also run failed and timed-out points again")
    p.add_argument("--dry-run", action="store_true", help="list the points and what would run; run nothing")
    p.add_argument("--force", action="store_true", help="delete a different sweep found in --out and start over")
    p.add_argument("--gpus-per-run", type=int, default=None, metavar="K",
                   help="give each point K GPUs: locally, disjoint CUDA_VISIBLE_DEVICES sets of K, as many points at "
                        "once as there are sets (without GPUs points run one after another); with --backend slurm, "
                        "--gres=gpu:K per array task")
    p.add_argument("--no-report", action="store_true", help="skip the report notebook")
    add_quiet(p)
    g = p.add_argument_group("Slurm (--backend slurm)")
    g.add_argument("--backend", choices=["local", "slurm"], default="local",
                   help="local: run the points on this machine (default); slurm: submit the points still to run as "
                        "one Slurm job array (sbatch), one point per task, into the same OUT/runs/<id>/; OUT must be "
                        "on a filesystem the nodes share. Rerunning collects what ran and submits only what is "
                        "neither finished nor queued/running")
    g.add_argument("--max-concurrent", type=int, default=None, metavar="K",
                   help="at most K array tasks at once (sbatch --array=...%%K; default: as many as Slurm allows)")
    g.add_argument("--time", default=None, metavar="LIMIT",
                   help="time limit per task (sbatch --time, e.g. 30 or 1:00:00; default: --timeout + 5 min when "
                        "--timeout is given, else the partition's)")
    g.add_argument("--partition", default=None, help="sbatch --partition (default: the cluster's default)")
    g.add_argument("--account", default=None, help="sbatch --account")
    g.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="one more sbatch option, passed through as written, e.g. --sbatch-arg=--mem=16G "
                        "(repeatable)")
    g.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="block until the array is done, showing each point as it ends, then write the report; "
                        "--no-wait: submit, print the job id and return, and the same command later collects and "
                        "resumes (default: --wait)")
    p.set_defaults(func=sweep)

    from . import COMMANDS  # its help quotes experiments.demo.MINUTES (a test holds them equal) without importing it

    p = sub.add_parser("demo", help=COMMANDS["demo"][1],
                       description="Prepare shapes16k if needed, run the scaling sweep (all GPUs, or 4 simulated CPU "
                                   "replicas), a small batch-size x LR-rule sweep and a short all-reduce bench, render "
                                   "the report and print where report.html is. Running it again resumes.")
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--force", action="store_true", help="redo a sweep in --out whose spec (sweeps/*.yaml) changed")
    add_quiet(p)
    p.set_defaults(func=demo)

    p = sub.add_parser("tensorboard", help="open TensorBoard on a run or a sweep (scalars, HParams, profiler traces)",
                       description="Start TensorBoard on RUN_DIR/tensorboard, or on a sweep folder (every point's runs "
                                   "side by side, compared in the HParams tab). The same as `tensorboard --logdir "
                                   "DIR --host 127.0.0.1`; stop it with Ctrl-C.")
    p.add_argument("dir", metavar="RUN_OR_SWEEP_DIR", help="a run directory, a sweep folder, or any folder of runs")
    p.add_argument("--port", type=int, default=6006, help="port to serve on (default: 6006)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only; "
                                                     "0.0.0.0 shares it on the network)")
    p.set_defaults(func=tensorboard)


def sweep(args) -> int:
    from ..experiments.sweep import local as sweep_mod
    from ..experiments.sweep.spec import load as load_spec

    spec = load_spec(args.spec)
    out = Path(args.out)
    if args.dry_run:
        rows = sweep_mod.dry_run(spec, out, rerun_failed=args.rerun_failed, force=args.force)
        n_run = sum(r["action"] == "run" for r in rows)
        print(f"{spec.notebook.name}: {len(rows)} points, {n_run} would run, {len(rows) - n_run} would be skipped")
        if spec.fixed:
            print("  every point: " + ", ".join(f"{k}={v!r}" for k, v in spec.fixed.items()))
        width = max(len(r["id"]) for r in rows)
        for r in rows:
            params = ", ".join(f"{k}={v!r}" for k, v in r["params"].items() if k not in spec.fixed)
            print(f"  {r['action']:4}  {r['id']:<{width}}  {r['status']:<8}  {params}")
        return 0
    if args.backend == "slurm":
        from ..cluster import slurm
        from ..experiments.sweep import slurm as sweep_slurm

        opts = slurm.ArrayOptions(max_concurrent=args.max_concurrent, gpus_per_task=args.gpus_per_run,
                                  time=args.time, partition=args.partition, account=args.account,
                                  extra=list(args.sbatch_arg))
        s = sweep_slurm.run(spec, out, opts=opts, timeout=args.timeout, rerun_failed=args.rerun_failed,
                            force=args.force, wait=args.wait, report=not args.no_report, quiet=args.quiet)
        if s["jobs"]:
            print(f"submitted Slurm job array {', '.join(s['jobs'])} ({s['ran']} point(s)); logs in {out / 'slurm'}")
        if s["in_flight"] and not args.wait:
            print(f"{len(s['in_flight'])} point(s) queued or running; run the same command again to collect them")
    else:
        for name in ("max_concurrent", "time", "partition", "account"):
            if getattr(args, name) is not None:
                raise SweepError(f"--{name.replace('_', '-')} is a Slurm option: add --backend slurm")
        if args.sbatch_arg:
            raise SweepError("--sbatch-arg is a Slurm option: add --backend slurm")
        s = sweep_mod.run(spec, out, timeout=args.timeout, rerun_failed=args.rerun_failed, force=args.force,
                          gpus_per_run=args.gpus_per_run, report=not args.no_report, quiet=args.quiet)
    c = s["counts"]
    unfinished = c["pending"] + c["queued"] + c["running"]
    print(f"{s['results']}: {c['ok']} ok, {c['diverged']} diverged, {c['failed']} failed, {c['timeout']} timed out"
          + (f", {c['cancelled']} cancelled" if c["cancelled"] else "")
          + (f", {unfinished} unfinished" if unfinished else ""))
    if s["report"]:
        print(f"report: {s['report']}" + (f" (report notebook failed: {s['report_error']})" if s["report_error"] else ""))
    elif s["report_error"]:
        print(f"report failed: {s['report_error']}", file=sys.stderr)
    kept = c["failed"] + c["timeout"] + c["cancelled"] - s["new_failures"]
    if kept > 0:
        print(f"{kept} point(s) failed, timed out or were cancelled in an earlier run and are kept as they are "
              "(--rerun-failed runs them again)")
    # Exit 1 when something run now failed (or the report did); failures kept from earlier runs were reported then.
    return 0 if not (s["new_failures"] or s["report_error"]) else 1


def demo(args) -> int:
    """Run the demo, then say where the report is."""
    from ..experiments import demo as demo_mod

    r = demo_mod.run(args.out, force=args.force, quiet=args.quiet)
    bad = 0
    for name, s in r["sweeps"].items():
        c = s["counts"]
        bad += c["failed"] + c["timeout"]
        print(f"{name}: {c['ok']} ok, {c['diverged']} diverged, {c['failed']} failed, {c['timeout']} timed out "
              f"({s['results']})")
    print(f"demo finished in {r['wall_s'] / 60:.1f} min")
    if r["report"]:
        print(f"report: {Path(r['report']).resolve()}")
    if r["report_error"]:
        print(f"the report notebook failed: {r['report_error']}")
    return 0 if r["report"] and not r["report_error"] and not bad else 1


def tensorboard(args) -> int:
    """Run TensorBoard in the foreground on the folder's event files."""
    import subprocess

    from ..errors import RunDirError

    folder = Path(args.dir)
    if not folder.is_dir():
        raise RunDirError(f"{folder} is not a folder; give a run directory or a sweep folder")
    logdir = folder / "tensorboard" if (folder / "tensorboard").is_dir() else folder
    if not any(logdir.rglob("events.out.tfevents.*")):
        raise RunDirError(f"no TensorBoard event files under {folder}: runs write them into RUN_DIR/tensorboard "
                          "(runs made before tftoolkit wrote them have none)")
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", args.host,
           "--port", str(args.port)]
    print(f"TensorBoard on {logdir}: http://{args.host}:{args.port}/  (Ctrl-C stops it)", flush=True)
    return run_in_group(cmd)


def run_in_group(cmd: list[str]) -> int:
    """Run ``cmd`` in a process group of its own until it ends, or until this process gets SIGTERM or SIGINT:
    then the whole group goes (TensorBoard starts a data server of its own, which a signal to TensorBoard alone
    left running), and the child dies with this process if it is SIGKILLed."""
    import signal
    import subprocess

    from ..cluster.procs import die_with_parent, stop_group

    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent)
    stopped = []

    def stop(signum, frame):
        stopped.append(signum)
        stop_group(proc, grace_s=5.0)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if stopped else code
