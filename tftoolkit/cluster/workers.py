"""A worker's way into a multi-worker run: join the cluster, check every worker agrees, leave markers.

``join`` is what a worker does before anything else touches TensorFlow: it sets up its devices, lets the
chief open the run directory, creates the MultiWorkerMirroredStrategy (which blocks until every worker has
connected, under a watchdog that ends a worker waiting past the join timeout) and checks that every worker
runs the same config with the same number of replicas. ``tftoolkit.training`` then runs the worker's part
of the training, on the strategy this made.

Every worker must run the same sequence of collectives or the job hangs. Everything the loop decides
(divergence stop, evaluation, checkpoints, the measurement steps) follows from the step number and from
all-reduced losses, which are the same on every worker.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from .. import rundir
from ..engine import devices
from ..errors import ClusterError, ConfigError
from . import procs
from .spec import (DEFAULT_JOIN_TIMEOUT_S, ENV_JOIN_TIMEOUT, ENV_LAUNCH_DIR, ENV_LAUNCHER_PID, Cluster,
                   check_port_free, is_local)

# TensorFlow is imported inside the functions that need it: the launcher (cluster/launch.py, a parent process
# that never trains) imports this module and must not start TensorFlow.

log = logging.getLogger("tftoolkit")


# --- joining ---------------------------------------------------------------------------------------------
def join_timeout() -> float:
    try:
        return float(os.environ.get(ENV_JOIN_TIMEOUT, DEFAULT_JOIN_TIMEOUT_S))
    except ValueError:
        raise ConfigError(f"{ENV_JOIN_TIMEOUT} must be a number of seconds, got {os.environ[ENV_JOIN_TIMEOUT]!r}") from None


def mark(name: str, cluster: Cluster) -> None:
    """Leave ``<name>-<worker>`` in the launcher's directory (started, joined, finished), if there is one."""
    d = os.environ.get(ENV_LAUNCH_DIR)
    if d:
        try:
            Path(d, f"{name}-{cluster.worker_id}").touch()
        except OSError:
            pass


class JoinWatchdog:
    """Ends this process with a clear message when the cluster has not formed within the join timeout.

    Creating MultiWorkerMirroredStrategy blocks until every worker has connected, and TensorFlow has no
    usable timeout for that (cluster_register_timeout_in_ms did not fire in a 60 s test; SIGTERM is caught
    while it waits). A thread cannot help either: the wait sometimes holds the GIL, so a watchdog thread
    never ran in one of our tests. So a tiny separate process keeps the time: unless this process says it
    has joined (or dies) first, it prints the message and kills this process (exit status 137).
    """

    _CODE = ("import os, select, signal, sys\n"
             "pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]\n"
             "if not select.select([sys.stdin], [], [], seconds)[0]:\n"
             "    sys.stderr.write(message + '\\n'); sys.stderr.flush(); os.kill(pid, signal.SIGKILL)\n")

    def __init__(self, cluster: Cluster, timeout_s: float):
        self.cluster, self.timeout_s = cluster, timeout_s
        self._proc = None

    def message(self) -> str:
        others = [a for i, a in enumerate(self.cluster.addresses) if i != self.cluster.worker_id]
        return (f"tftoolkit train: error: worker {self.cluster.worker_id} ({self.cluster.address}) waited "
                f"{self.timeout_s:g} s and the cluster did not form: no answer from {', '.join(others)}. Start every "
                "worker (same command, its own TF_CONFIG), check the hosts can reach each other on those ports, "
                f"or raise {ENV_JOIN_TIMEOUT}")

    def __enter__(self):
        self._proc = subprocess.Popen([sys.executable, "-c", self._CODE, str(os.getpid()), str(self.timeout_s),
                                       self.message()], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        self._proc.stdin.close()  # end of input: the watchdog exits without doing anything
        self._proc.wait()


def agree(cluster: Cluster, config, setup, timeout_s: float) -> None:
    """Check that every worker runs the same config with the same replicas each; ConfigError on all if not.

    Runs right after the strategy is created, before any collective: a mismatch found later would be a hang.
    Each worker posts what it runs to the coordination service's key-value store and reads everyone's, so
    every worker reaches the same verdict without a collective.
    """
    from tensorflow.python.eager import context  # deferred: see the note under the imports

    ctx = context.context()
    mine = {"replicas_per_worker": setup.replicas, "device_kind": setup.kind, 
            "config": rundir.identity(config.to_dict())}
    ctx.set_config_key_value(f"tftoolkit/agree/{cluster.worker_id}", json.dumps(mine))
    posts = []
    for k in range(cluster.workers):
        try:
            posts.append(json.loads(ctx.get_config_key_value(f"tftoolkit/agree/{k}", int(timeout_s * 1000))))
        except Exception as e:  # noqa: BLE001 - TensorFlow raises its own error types here
            raise ClusterError(f"worker {k} ({cluster.addresses[k]}) joined but did not report its config within "
                               f"{timeout_s:g} s ({type(e).__name__}); is it running the same tftoolkit?") from None
    per = [p["replicas_per_worker"] for p in posts]
    if len(set(per)) > 1:
        raise ConfigError("workers run different numbers of replicas: " +
                          ", ".join(f"worker {k} has {n} ({posts[k]['device_kind']})" for k, n in enumerate(per)) +
                          "; every worker needs the same count (--replicas counts all workers' replicas, "
                          "or give each host the same GPUs)")
    chief = posts[0]["config"]
    for k, p in enumerate(posts[1:], start=1):
        diff = sorted(key for key in set(chief) | set(p["config"]) if chief.get(key) != p["config"].get(key))
        if diff:
            raise ConfigError(f"worker {k} runs a different config from the chief: " +
                              ", ".join(f"{key} ({p['config'].get(key)!r} there, {chief.get(key)!r} on the chief)"
                                        for key in diff) + "; start every worker with the same options")




def join(config, cluster: Cluster, out, *, force: bool = False):
    """Join ``cluster`` as this worker; returns (device setup, (strategy, impl), run directory, lock or None).

    The chief locks and opens the run directory (``rundir.lock``, ``rundir.prepare``) before the strategy is
    created: creating it waits for the chief, so no worker touches the run directory until the chief has
    cleared (--force) or reopened it. Only the chief writes there, so the lock is the chief's; the caller
    releases it when the run ends.
    """
    follow_launcher()
    host, _, port = cluster.address.rpartition(":")
    if is_local(host):
        check_port_free(int(port), f"worker {cluster.worker_id}'s address {cluster.address} in {cluster.source}")
    timeout_s = join_timeout()
    out = Path(out)
    mark("started", cluster)
    lock = None
    try:
        with JoinWatchdog(cluster, timeout_s):
            setup = devices.init(config.replicas_per_worker, config.gpus)
            if cluster.is_chief:
                lock = rundir.lock(out)
                out, _ = rundir.prepare(out, config.to_dict(), force=force)
            # Here, not at the top: the launcher imports this module and runs no TensorFlow (devices.init above
            # is this worker's first import of it, frozen).
            from ..engine.strategy import make_multiworker_strategy

            # Must come before any other TensorFlow op: it starts this worker's gRPC server and collective runtime.
            strategy = make_multiworker_strategy(setup, config.cross_device_ops)
            agree(cluster, config, setup, timeout_s)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    mark("joined", cluster)
    log.info("worker %d of %d (%s%s), %d replica(s) here, %d in all", cluster.worker_id, cluster.workers,
             cluster.address, ", chief" if cluster.is_chief else "", setup.replicas, config.replicas)
    out.mkdir(parents=True, exist_ok=True)
    return setup, strategy, out, lock


def follow_launcher() -> None:
    """In a worker started by ``launch``: die with the launcher (Linux), and stop now if it is already gone."""
    pid = os.environ.get(ENV_LAUNCHER_PID)
    if not pid:
        return
    if not procs.die_with_parent(int(pid)):
        sys.stderr.write("tftoolkit train: the launcher that started this worker is gone; stopping\n")
        os._exit(1)
