"""``tftoolkit.train``: train data-parallel as a config says and write the run directory.

One entry for every way a run starts: one process (N GPUs or N simulated replicas), one worker of a
cluster that TF_CONFIG or Slurm describes, or a multi-worker config with no cluster around, whose workers
are then launched on this machine (``cluster.launch``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .. import fileio, rundir
from .. import summary as summary_schema
from ..config import RunConfig
from ..errors import ConfigError
from ..logs import ensure_logging

log = logging.getLogger("tftoolkit")


def default_out(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{config.model.replace(':', '_').replace('.', '_')}-r{config.replicas}"


def train(config: RunConfig | dict, out: str | Path | None = None, *, force: bool = False, quiet: bool = False,
          data=None, model=None, loss=None, metrics=None) -> dict:
    """Train data-parallel as ``config`` says and write the run directory; returns the summary dict.

    ``data`` instead of ``config.dataset``: NumPy arrays (x, y) or (x, y, x_val, y_val), or a tf.data.Dataset of
    unbatched (image, label) pairs, or a (train, validation) pair of them (data.registry.load_source).
    ``model`` instead of ``config.model``: any callable ``fn(input_shape, num_classes) -> keras.Model``, one
    defined in a notebook cell included; the config records its qualified name (``__main__.my_model``).
    Both stay in this process: a sweep runs its points in fresh processes, so there they are names
    (a registered model or ``package.module:function``, a dataset name or folder).

    ``data`` for another task than image classification: (x, y) or (x, y, x_val, y_val) where x is what the model
    takes and y what the loss compares its outputs with, each an array or a dict / tuple of arrays (several inputs
    or outputs), or tf.data datasets of unbatched (inputs, targets) pairs. ``loss``: a Keras loss (an object or a
    name), or a callable ``(y_true, y_pred) -> per-example losses``, or one per output (a dict by output name);
    ``metrics``: Keras metrics (objects or names), each reported as ``val_<name>``. A model its builder compiled
    brings its own loss and metrics. engine/losses.py says how a loss is divided so that N replicas equal one
    device (one value per example, averaged over pixels or tokens as Keras does). Names go into the config
    (``loss``, ``metrics``), so they are recorded and reach sweeps and the CLI (``--loss mse``).
    """
    from ..cluster import spec  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)
    from ..engine import session  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

    ensure_logging(quiet)
    if out is not None:
        out = rundir.path(out)  # "" would be the working folder
    config, cluster = spec.resolve(config)  # a cluster in TF_CONFIG or Slurm sets `workers`
    # Resolved once, here: the run directory's name and lock need it before the set-up (start(resolved=True)).
    config = session.resolve(config, model)  # a model callable is named in it: the run directory records it
    config, loss, metrics = session.with_task(config, loss, metrics)  # names into the config; objects stay here
    if config.workers > 1:
        from ..data import registry  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

        registry.check_sharding(config, data)
        if out is None:
            raise ConfigError("a multi-worker run needs a run directory (out=... / --out) that every worker names")
        if cluster is None:
            if data is not None or model is not None or loss is not None or metrics is not None:
                raise ConfigError("in-memory data, model callables and loss or metric objects cannot be handed to "
                                  "worker processes; give a dataset name, a model name (or package.module:function) "
                                  "and loss / metric names, or run the workers yourself (TF_CONFIG) with them in each")
            from ..cluster import launch  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

            return launch.train_here(config, out, force=force, quiet=quiet)
        return _train_worker(config, cluster, out, force=force, quiet=quiet, data=data, model=model, loss=loss,
                             metrics=metrics)
    out = Path(out) if out is not None else default_out(config)
    # Held from before anything is set up (a second process stops at once) until the summary is written, and
    # before --force may clear the folder: one writer per run directory.
    with rundir.lock(out):
        sess = session.start(config, data, model=model, loss=loss, metrics=metrics, resolved=True)
        out, resuming = rundir.prepare(out, sess.config.to_dict(), force=force)
        return _run(sess, out, quiet, resuming=resuming)


def _train_worker(config, cluster, out, *, force, quiet, data, model, loss=None, metrics=None) -> dict:
    """This worker's part of a multi-worker run; returns the summary (a non-chief's copy is not written)."""
    from ..cluster import workers  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)
    from ..engine import session  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

    setup, strategy, out, lock = workers.join(config, cluster, out, force=force)
    try:
        sess = session.start(config, data, setup=setup, strategy=strategy, model=model, loss=loss, metrics=metrics,
                             worker=(cluster.worker_id, cluster.workers), resolved=True)
        # Every worker reads summary.json after all have joined, when only the chief could have changed it.
        hosts = len({a.rsplit(":", 1)[0] for a in cluster.addresses})
        summary = _run(sess, out, quiet, resuming=True, worker_id=cluster.worker_id, workers=cluster.workers,
                       hosts=hosts)
    finally:
        if lock is not None:
            lock.release()
    workers.mark("finished", cluster)
    return summary


def _run(sess, out: Path, quiet: bool, *, resuming: bool, worker_id: int = 0, workers: int = 1,
         hosts: int = 1) -> dict:
    from .run import Run  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

    if resuming and (out / "summary.json").exists():
        try:
            previous = summary_schema.read(out)
        except ValueError as e:  # damaged (summary.read says how): the run resumes from its checkpoints and rewrites it
            log.warning("%s; resuming from the checkpoints, which rewrites it", e)
            previous = {}
        if previous.get("status") == "ok":
            # Finished: nothing runs, so nothing is rewritten (config.json keeps what the run ran with). Options
            # that do not define the run but would have changed its files are named.
            old = fileio.read_json(out / "config.json").get("config", {}) if (out / "config.json").exists() else {}
            changed = sorted(k for k, v in sess.config.to_dict().items() if k in old and old[k] != v)
            note = (f"; it ran with {', '.join(f'{k}={old[k]!r}' for k in changed)} (now "
                    f"{', '.join(f'{k}={sess.config.to_dict()[k]!r}' for k in changed)}): pass --force to run it "
                    "again with them" if changed else "")
            log.info("%s already holds a finished run of this config; nothing to do%s", out, note)
            return previous
    if worker_id == 0:
        fileio.write_json(out / "config.json", rundir.config_record(
            sess.config.to_dict(), derived=sess.derived, dataset={"name": sess.source.name, **sess.source.info}))
    return Run(sess, out, quiet, worker_id=worker_id, workers=workers, hosts=hosts).execute()
