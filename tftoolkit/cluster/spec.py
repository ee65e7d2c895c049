"""Several worker processes (hosts), one run: which cluster this process belongs to.

A run is multi-worker when ``RunConfig.workers`` > 1 or the environment describes a cluster:

  TF_CONFIG        {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": k}}
                   (a "chief" job is accepted too: it is worker 0). Checked here, with messages saying what is wrong.
  Slurm            inside ``srun`` with more than one task: TensorFlow's SlurmClusterResolver turns the allocation
                   into a cluster (one worker per task, ports from TFTOOLKIT_BASE_PORT, default 12345), written
                   to TF_CONFIG so the rest of the run sees one kind of cluster.
  neither          ``tftoolkit.cluster.launch`` starts ``workers`` processes on this machine (free localhost ports).

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
from dataclasses import dataclass

from ..config import RunConfig
from ..errors import ConfigError

# TensorFlow is imported inside the functions that need it: ``tftoolkit train``'s argument handling (cli/train.py)
# imports this module before anything needs TensorFlow.

log = logging.getLogger("tftoolkit")

JOBS = ("chief", "worker")          # the jobs MultiWorkerMirroredStrategy trains with, chief first
DEFAULT_BASE_PORT = 12345           # first port on each host for --print-tf-config and Slurm
DEFAULT_JOIN_TIMEOUT_S = 120.0      # TensorFlow import + data + rendezvous; generous for loaded machines

# Set by tftoolkit.cluster.launch for the workers it starts (and readable by any launcher): the join timeout, and a
# directory where each worker leaves started-<k> / joined-<k> / finished-<k> markers the launcher watches.
ENV_JOIN_TIMEOUT = "TFTOOLKIT_JOIN_TIMEOUT"
ENV_LAUNCH_DIR = "TFTOOLKIT_LAUNCH_DIR"
ENV_BASE_PORT = "TFTOOLKIT_BASE_PORT"
ENV_LAUNCHER_PID = "TFTOOLKIT_LAUNCHER_PID"  # a launched worker dies with the launcher of this pid


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
    from ..engine.devices import import_tensorflow

    import_tensorflow()  # the worker's first import of it: start-up lines held, its objects frozen
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as scr  # deferred: see the top

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
def is_local(host: str) -> bool:
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
