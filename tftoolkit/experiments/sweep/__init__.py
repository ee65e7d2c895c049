"""Sweeps: run a notebook over a parameter grid with papermill: one process per point, resumable, failure-isolated.

    tftoolkit sweep sweeps/scaling.yaml --out runs/scaling [--timeout S] [--gpus-per-run K] [--rerun-failed]

SWEEP_DIR/
  sweep.json              the spec and its points (a different sweep is refused here unless --force)
  runs/<id>/              one folder per point: the executed notebook, parameters.json, point.json (status,
                          error, timings, figures), log.txt, and whatever the notebook wrote (out_dir = here)
  results.csv             one row per point: id, parameters, status, error, wall_s, the run summary's figures
  report.ipynb, report.html, report/   the report notebook run on this sweep

Statuses: ``ok``, ``diverged`` (the run stopped itself: a result, not a crash), ``failed`` (the notebook raised
or its kernel died, e.g. out of memory), ``timeout`` (ran past --timeout, or Slurm's time limit), ``cancelled``
(scancel, Slurm backend), and, for points not finished, ``pending`` / ``queued`` (submitted to Slurm) /
``running``. A failing point is recorded and the sweep goes on. A report on a folder where no sweep works (its
lock is free) reads a point that a killed sweep left ``running`` as ``interrupted``: the rerun runs it again.

Backends: ``local`` runs points on this machine; ``slurm`` submits them as a Slurm job array whose tasks
(``task``) run each point through the same ``local.start_point`` / ``local.finish_point``.

    spec      the spec file and its points, checked against the notebook's parameters
    folder    the sweep folder and each point's record (point.json): statuses, what a point produced
    results_csv  results.csv, rebuilt from the records
    local     the local scheduler: points in their own processes, GPU sets, timeouts
    point     one point's process (papermill), started by local
    slurm     the Slurm backend (job arrays), and task: one array task
    html      the report notebook run on a sweep, rendered as report.html

Resume: running the same command again skips points that finished (ok, diverged, failed, timeout) and runs
those that never finished; ``--rerun-failed`` also runs the failed and timed-out ones again. Each point's
point.json is the record, written atomically when the point ends; results.csv is rebuilt from those records
(atomically) after every point. So a sweep killed at any moment, even with SIGKILL, loses at most the points
in flight, and results.csv is always whole: the old table or the new one.

GPUs: each point sees its own GPUs through CUDA_VISIBLE_DEVICES. With ``--gpus-per-run K`` the visible GPUs
are cut into disjoint sets of K and that many points run at once; without it each point sees every GPU and
points run one after another. Without GPUs points always run one after another (simulated replicas already
share all the host's cores).
"""
