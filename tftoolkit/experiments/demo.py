"""The main job, ``tftoolkit demo --out runs/demo`` (``make demo``): data, two sweeps, one report.

1. shapes16k is generated into data/ if it is not there yet (about 20 s on 2 cores);
2. the scaling sweep (sweeps/scaling.yaml: notebook 01 once per replica count) into OUT/scaling: on a GPU
   machine at 1, 2, 4 ... up to every GPU, otherwise at 1, 2 and 4 CPU-simulated replicas;
3. the batch-size x LR-rule sweep (sweeps/batch_lr.yaml: notebook 02) into OUT/batch_lr;
4. a short all-reduce bench (``tftoolkit bench allreduce``) into OUT/allreduce;
5. the report (notebook 04 on all three) into OUT/report.ipynb and OUT/report.html, whose path is printed.

About MINUTES minutes on a quiet 2-core machine without GPU (BENCHMARKS.md; the CLI's help and the README say
the same, and a test keeps them in step). Running it again resumes: finished points are kept.
The sweeps are the example specs in sweeps/, so what the demo runs is what a user reads there; on GPUs a few
values are changed to suit them (replica counts, a larger model and batch), and printed.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .. import logs, rundir
from ..data.registry import ensure_shapes16k
from ..data.home import default_dir
from ..errors import SweepError, ToolkitError
from .sweep import local
from .sweep.html import render_report
from .sweep.spec import load as load_spec

log = logging.getLogger("tftoolkit")

ROOT = Path(__file__).resolve().parents[2]  # the repository: sweeps/ and notebooks/
SWEEPS = ROOT / "sweeps"
REPORT_NOTEBOOK = ROOT / "notebooks" / "04_report.ipynb"
POINT_TIMEOUT_S = 900  # a point that hangs is recorded as timed out; the demo goes on
MINUTES = 7  # its wall time on a quiet 2-core machine without GPU, measured (BENCHMARKS.md): the one statement of it


def replica_counts(gpus: int) -> list[int]:
    """1, 2, 4 ... up to ``gpus`` (and ``gpus`` itself); [1, 2, 4] simulated replicas without GPUs."""
    if gpus <= 0:
        return [1, 2, 4]
    counts = [1]
    while counts[-1] * 2 <= gpus:
        counts.append(counts[-1] * 2)
    if counts[-1] != gpus:
        counts.append(gpus)
    return counts


def specs(gpus: int) -> dict[str, dict]:
    """The demo's two sweep specs: sweeps/scaling.yaml and sweeps/batch_lr.yaml, adjusted to this machine."""

    out = {}
    for name in ("scaling", "batch_lr"):
        path = SWEEPS / f"{name}.yaml"
        if not path.is_file():
            raise ToolkitError(f"{path} not found: `tftoolkit demo` runs the example sweeps and notebooks of a clone "
                               "of the repository; run it from the clone (make demo)")
        out[name] = yaml.safe_load(path.read_text())
    if gpus:
        # On GPUs the CPU-sized defaults would measure Python overhead, not the GPUs.
        out["scaling"]["grid"]["replicas"] = replica_counts(gpus)
        out["scaling"]["fixed"].update({"model": "resnet20", "per_replica_batch": 128, "steps": 200,
                                        "timing_warmup_steps": 20})
        out["batch_lr"]["fixed"].update({"replicas": gpus, "dataset": "shapes16k", "epochs": 10.0, "train_images": 0})
    for spec in out.values():
        spec["report"] = None  # one report over both sweeps, rendered at the end
    return out


def run(out="runs/demo", *, force: bool = False, quiet: bool = False) -> dict:
    """Run the demo into ``out``; returns {"report": html path, "sweeps": {...}, "wall_s": ...}."""
    logs.ensure_logging(quiet)
    out = Path(out)
    # One demo per folder; its sweeps lock their own folders too, so a sweep started by hand there waits its turn.
    with rundir.lock(out, "demo folder"):
        return _run(out, force, quiet)


def _run(out: Path, force: bool, quiet: bool) -> dict:
    t0 = time.time()
    gpus = local.visible_gpus()
    log.info("demo: %s", f"{len(gpus)} GPU(s) visible: scaling over {replica_counts(len(gpus))} replicas" if gpus
             else "no GPU: replicas are simulated as 4 logical CPU devices sharing the host's cores")
    _prepare_data()
    results = {}
    for name, spec in specs(len(gpus)).items():
        loaded = load_spec(spec, base_dir=SWEEPS)
        log.info("demo: sweep %s (%d points) -> %s", name, len(loaded.points), out / name)
        try:
            results[name] = local.run(loaded, out / name, timeout=POINT_TIMEOUT_S, force=force, report=False,
                                      quiet=quiet)
        except SweepError as e:
            if "different sweep" not in str(e):
                raise
            raise SweepError(f"{out / name} holds results of a different {name} sweep (was sweeps/{name}.yaml "
                             "changed?); run `tftoolkit demo --force` to redo it, or give another --out") from None
    sources = [out / name for name in results]
    if _bench_allreduce(out / "allreduce", len(gpus) or 4, gpus=bool(gpus), quiet=quiet):
        sources.append(out / "allreduce")
    log.info("demo: report")
    html, error = render_report(REPORT_NOTEBOOK, sources, out, timeout=POINT_TIMEOUT_S)
    return {"report": html, "report_error": error, "sweeps": results, "wall_s": time.time() - t0}


def _bench_allreduce(out: Path, replicas: int, gpus: bool, quiet: bool) -> bool:
    """All-reduce time and bandwidth per implementation (``tftoolkit bench allreduce``, in its own process so
    this one never imports TensorFlow), for the report's communication figures. Kept when already there."""
    if (out / "allreduce.csv").exists():
        return True
    sizes = "4KiB..256MiB" if gpus else "4KiB,64KiB,1MiB,16MiB"
    cmd = [sys.executable, "-m", "tftoolkit", "bench", "allreduce", "--replicas", str(replicas), "--sizes", sizes,
           "--repeats", "5", "--models", "small_cnn", "--out", str(out), "--quiet"]
    log.info("demo: all-reduce bench on %d replicas (%s) -> %s", replicas, sizes, out)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=POINT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("demo: the all-reduce bench ran past %d s; the report goes without it", POINT_TIMEOUT_S)
        return False
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        log.warning("demo: the all-reduce bench failed (%s); the report goes without it", last)
        return False
    return True


def _prepare_data() -> None:
    t0 = time.time()
    ensure_shapes16k()
    log.info("demo: shapes16k ready in %s (%.0f s)", default_dir(), time.time() - t0)
