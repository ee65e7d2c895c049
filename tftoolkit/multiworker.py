"""Several worker processes (hosts), one run: cluster description, joining, and who writes what.

A run is multi-worker when ``RunConfig.workers`` > 1 or the environment describes a cluster:

  TF_CONFIG        {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": k}}
                   (a "chief" job is accepted too: it is worker 0). Checked here, with messages saying what is wrong.
  Slurm            inside ``srun`` with more than one task: TensorFlow's SlurmClusterResolver turns the allocation
                   into a cluster (one worker per task, ports from TFTOOLKIT_BASE_PORT, default 12345), written
                   to TF_CONFIG so the rest of the run sees one kind of cluster.
  neither          ``tftoolkit.launch`` starts ``workers`` processes on this machine (free localhost ports).

``RunConfig.replicas`` counts every worker's replicas; each worker runs ``replicas / workers`` of them
(GPUs, or logical CPU devices where there is none) and MultiWorkerMirroredStrategy all-reduces across all.
Worker 0 is the chief: it alone writes config.json, summary.json, steps.csv, evals.csv and env.json and
keeps checkpoints. Every worker writes its own monitor file (the chief's is monitor.csv, as in any run;
worker k's is monitor-worker<k>.csv) and saves checkpoints too, because saving can run collectives, but a
non-chief saves to a temporary directory it deletes at once (TensorFlow's multi-worker rule). Resuming
therefore needs the run directory on a filesystem every worker sees (always true on one machine).

Every worker must run the same sequence of collectives or the job hangs. Everything the loop decides
(divergence stop, evaluation, checkpoints, the measurement steps) follows from the step number and from
all-reduced losses, which are the same on every worker, and the workers check at start that they run the
same config with the same number of replicas each.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ClusterError, ConfigError

log = logging.getLogger("tftoolkit")

JOBS = ("chief", "worker")          # the jobs MultiWorkerMirroredStrategy trains with, chief first
DEFAULT_BASE_PORT = 12345           # first port on each host for --print-tf-config and Slurm
DEFAULT_JOIN_TIMEOUT_S = 120.0      # TensorFlow import + data + rendezvous; generous for loaded machines

# Set by tftoolkit.launch for the workers it starts (and readable by any launcher): the join timeout, and a
# directory where each worker leaves started-<k> / joined-<k> / finished-<k> markers the launcher watches.
ENV_JOIN_TIMEOUT = "TFTOOLKIT_JOIN_TIMEOUT"
ENV_LAUNCH_DIR = "TFTOOLKIT_LAUNCH_DIR"
ENV_BASE_PORT = "TFTOOLKIT_BASE_PORT"


@dataclass(frozen=True)
class Cluster:
    """This process's place in a multi-worker job."""

    addresses: tuple[str, ...]   # every worker's host:port, chief first (global worker id order)
    worker_id: int               # 0 = chief
    source: str                  # "TF_CONFIG" or "Slurm"
    tf_config: str               # the TF_CONFIG this process runs with

    @property
    def workers(self) -> int:
        return len(self.addresses)

    @property
    def is_chief(self) -> bool:
        return self.worker_id == 0

    @property
    def address(self) -> str:
        return self.addresses[self.worker_id]


# --- TF_CONFIG -------------------------------------------------------------------------------------------
def parse_tf_config(text: str, source: str = "TF_CONFIG") -> Cluster:
    """Validate a TF_CONFIG for MultiWorkerMirroredStrategy; every problem is a ConfigError naming it."""
    where = "TF_CONFIG"
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{where} is not valid JSON ({e}); expected e.g. "
                          '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'
                          ) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} must be a JSON object with keys cluster and task, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - {"cluster", "task", "environment", "rpc_layer"})
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {', '.join(unknown)}; expected cluster and task")
    cluster, task = cfg.get("cluster"), cfg.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(f'{where}: "cluster" must map job names to lists of "host:port", e.g. '
                          '{"worker": ["host1:12345", "host2:12345"]}; got ' + json.dumps(cluster))
    other = sorted(set(cluster) - set(JOBS))
    if other:
        raise ConfigError(f"{where}: job(s) {', '.join(other)} are not supported: MultiWorkerMirroredStrategy trains "
                          "with a chief and workers (ps/evaluator jobs belong to other strategies)")
    addresses: list[str] = []
    offsets = {}
    for job in JOBS:
        if job not in cluster:
            continue
        hosts = cluster[job]
        if not isinstance(hosts, list) or not hosts:
            raise ConfigError(f'{where}: cluster.{job} must be a non-empty list of "host:port", got {json.dumps(hosts)}')
        if job == "chief" and len(hosts) != 1:
            raise ConfigError(f"{where}: cluster.chief must list exactly one address, got {len(hosts)}")
        offsets[job] = len(addresses)
        for i, addr in enumerate(hosts):
            _check_address(addr, f"{where}: cluster.{job}[{i}]")
            addresses.append(addr)
    dup = sorted({a for a in addresses if addresses.count(a) > 1})
    if dup:
        raise ConfigError(f"{where}: address(es) {', '.join(dup)} appear more than once; every worker needs its own port")
    if not isinstance(task, dict):
        raise ConfigError(f'{where}: "task" must be an object like {{"type": "worker", "index": 0}}, got {json.dumps(task)}')
    ttype, index = task.get("type"), task.get("index")
    if ttype not in cluster:
        raise ConfigError(f"{where}: task.type {ttype!r} is not a job in cluster ({', '.join(sorted(cluster))})")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[ttype]):
        raise ConfigError(f"{where}: task.index must be an integer from 0 to {len(cluster[ttype]) - 1} for job "
                          f"{ttype!r}, got {index!r}")
    return Cluster(tuple(addresses), offsets[ttype] + index, source, text)


def _check_address(addr, where: str) -> None:
    if not isinstance(addr, str) or addr.count(":") < 1:
        raise ConfigError(f'{where} must be a "host:port" string, got {addr!r}')
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f'{where} must be "host:port" with a port from 1 to 65535, got {addr!r}')


def tf_config(addresses: list[str], index: int) -> str:
    """The TF_CONFIG of worker ``index`` (worker 0 is the chief) in a cluster of ``addresses``."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


def tf_configs_for_hosts(hosts: str, base_port: int = DEFAULT_BASE_PORT) -> list[tuple[str, str]]:
    """(host, TF_CONFIG) for each host of ``h1,h2`` (port ``base_port``) or ``h1:p1,h2:p2``; first = chief."""
    addresses = []
    for h in [h.strip() for h in hosts.split(",") if h.strip()]:
        addresses.append(h if ":" in h else f"{h}:{base_port}")
    if not addresses:
        raise ConfigError("--print-tf-config needs at least one host, e.g. --print-tf-config node1,node2")
    for i, a in enumerate(addresses):
        _check_address(a, f"host {i + 1} ({a})")
    if len(set(addresses)) != len(addresses):
        raise ConfigError(f"--print-tf-config: hosts repeat ({hosts}); give host:port to run several workers per host")
    return [(a.rpartition(":")[0], tf_config(addresses, i)) for i, a in enumerate(addresses)]


# --- Slurm -----------------------------------------------------------------------------------------------
def slurm_tasks(environ=os.environ) -> int:
    try:
        return int(environ.get("SLURM_STEP_NUM_TASKS", "1"))
    except ValueError:
        return 1


def cluster_from_slurm(environ=os.environ) -> Cluster:
    """The cluster of this ``srun`` step, through TensorFlow's SlurmClusterResolver."""
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as scr

    base_port = int(environ.get(ENV_BASE_PORT, DEFAULT_BASE_PORT))
    try:
        per_node = max(scr.expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"]))
        # GPUs are Slurm's to bind (--gpus-per-task, or one task per node that sees all its GPUs), so the
        # resolver must not rewrite CUDA_VISIBLE_DEVICES. Its GPU arithmetic still runs: with 0 GPUs per node it
        # fails (range step 0) and with none given it shells out to nvidia-smi, so give it one slot per task.
        resolver = scr.SlurmClusterResolver(port_base=base_port, gpus_per_node=per_node, gpus_per_task=1,
                                            auto_set_gpu=False)
        spec = resolver.cluster_spec().as_dict()
        task_type, task_id = resolver.task_type, resolver.task_id
    except (KeyError, RuntimeError, ValueError) as e:
        raise ConfigError(f"cannot read the Slurm allocation: {e}; run the workers with srun inside the allocation "
                          "(examples/slurm_multiworker.sbatch)") from None
    text = json.dumps({"cluster": spec, "task": {"type": task_type, "index": task_id}})
    return parse_tf_config(text, source="Slurm")


# --- which cluster, if any -------------------------------------------------------------------------------
def cluster_from_env(environ=os.environ) -> Cluster | None:
    """The cluster TF_CONFIG or Slurm describes; None for an ordinary single-process run."""
    text = environ.get("TF_CONFIG")
    if text is not None and text.strip():
        cluster = parse_tf_config(text)
    elif "SLURM_PROCID" in environ and slurm_tasks(environ) > 1:
        cluster = cluster_from_slurm(environ)
        os.environ["TF_CONFIG"] = cluster.tf_config  # what MultiWorkerMirroredStrategy's resolver reads
    else:
        return None
    return cluster if cluster.workers > 1 else None


def resolve(config) -> tuple[object, Cluster | None]:
    """The config with ``workers`` fixed for this environment, and this process's cluster (None if single)."""
    from .config import RunConfig

    if isinstance(config, dict):
        config = RunConfig.from_dict(config)
    cluster = cluster_from_env()
    if cluster is not None and isinstance(config, RunConfig) and config.workers != cluster.workers:
        if config.workers != 1:
            raise ConfigError(f"workers={config.workers} but {cluster.source} describes {cluster.workers} workers "
                              f"({', '.join(cluster.addresses)}); give --workers {cluster.workers} or leave it out")
        config = config.replace(workers=cluster.workers)
    return config, cluster


# --- ports -----------------------------------------------------------------------------------------------
def _is_local(host: str) -> bool:
    if host in ("localhost", "", "0.0.0.0", "::", "[::1]") or host.startswith("127."):
        return True
    try:
        return host in (socket.gethostname(), socket.getfqdn()) or \
            socket.gethostbyname(host) in ("127.0.0.1", socket.gethostbyname(socket.gethostname()))
    except OSError:
        return False


def check_port_free(port: int, what: str) -> None:
    """ConfigError if something on this machine listens on ``port`` (TIME_WAIT leftovers do not count)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
    except OSError as e:
        raise ConfigError(f"port {port} ({what}) is in use on this machine ({e.strerror}); "
                          "choose another port or stop what holds it") from None
    finally:
        s.close()


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS reports free now (another program could take one before a worker binds it)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


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
    from tensorflow.python.eager import context

    from .rundir import identity

    ctx = context.context()
    mine = {"replicas_per_worker": setup.replicas, "device_kind": setup.kind, "config": identity(config.to_dict())}
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


# --- checkpoints -----------------------------------------------------------------------------------------
def checkpoint_write_dir(run_checkpoints: Path, cluster: Cluster | None) -> Path:
    """Where this worker saves: the run's checkpoints/ for the chief, a temporary directory for the others.

    TensorFlow requires every worker to save (saving may run collectives) but the files of one copy only
    must survive; the temporary directory is named as TensorFlow's own multi-worker helpers name it.
    """
    if cluster is None or cluster.is_chief:
        return run_checkpoints
    return run_checkpoints / f"workertemp_{cluster.worker_id}"


def gpu_count() -> int:
    """GPUs on this machine without initialising CUDA: CUDA_VISIBLE_DEVICES, else ``nvidia-smi -L``, else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


# --- one worker's part of a run --------------------------------------------------------------------------
def train(config, cluster: Cluster | None, out, *, force: bool = False, quiet: bool = False, data=None) -> dict:
    """Run this worker's part of a multi-worker run (``cluster`` None: start the workers here and wait).

    Called by ``tftoolkit.train`` once ``config.workers`` > 1; returns the run's summary (on a non-chief
    worker: its own copy, which is not written anywhere).
    """
    from .data import catalog
    from . import devices, fileio, rundir
    from .strategy import make_multiworker_strategy
    from .train import _Run

    if out is None:
        raise ConfigError("a multi-worker run needs a run directory (out=... / --out) that every worker names")
    if cluster is None:
        if data is not None:
            raise ConfigError("NumPy arrays cannot be handed to worker processes; give a dataset name, or run the "
                              "workers yourself (TF_CONFIG) with the arrays in each")
        from . import launch

        return launch.train_here(config, out, force=force, quiet=quiet)
    from .launch import follow_launcher

    follow_launcher()
    host, _, port = cluster.address.rpartition(":")
    if _is_local(host):
        check_port_free(int(port), f"worker {cluster.worker_id}'s address {cluster.address} in {cluster.source}")
    timeout_s = join_timeout()
    out = Path(out)
    mark("started", cluster)
    with JoinWatchdog(cluster, timeout_s):
        setup = devices.init(config.replicas_per_worker, config.gpus)
        if cluster.is_chief:
            # Before the strategy: creating it waits for the chief, so no worker touches the run directory
            # until the chief has cleared (--force) or reopened it.
            out, _ = rundir.prepare(out, config.to_dict(), force=force)
        # Must come before any other TensorFlow op: it starts this worker's gRPC server and collective runtime.
        strategy, impl = make_multiworker_strategy(setup, config.cross_device_ops)
        agree(cluster, config, setup, timeout_s)
    mark("joined", cluster)
    log.info("worker %d of %d (%s%s), %d replica(s) here, %d in all", cluster.worker_id, cluster.workers,
             cluster.address, ", chief" if cluster.is_chief else "", setup.replicas, config.replicas)
    out.mkdir(parents=True, exist_ok=True)
    source = catalog.load_source(config, data)
    derived = config.derived(source.train_examples)
    if cluster.is_chief:
        fileio.write_json(out / "config.json", {"config": config.to_dict(), "derived": derived,
                                                "dataset": {"name": source.name, **source.info}})
    # Every worker reads this after all have joined, when only the chief could have changed it: same answer.
    if (out / "summary.json").exists():
        previous = fileio.read_json(out / "summary.json")
        if previous.get("status") == "ok":
            log.info("%s already holds a finished run of this config; nothing to do", out)
            mark("finished", cluster)
            return previous
    summary = _Run(config, setup, source, derived, out, quiet, cluster=cluster, strategy=(strategy, impl)).execute()
    mark("finished", cluster)
    return summary
