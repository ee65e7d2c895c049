"""``tftoolkit launch``: start the workers of a multi-worker run on this machine, and watch them.

    tftoolkit launch --workers 2 --replicas-per-worker 2 -- train --model small_cnn --out runs/mw

starts two ``tftoolkit train`` processes, each with its own TF_CONFIG (free localhost ports, worker 0 is
the chief), ``--workers 2 --replicas 4`` added to the train options, and their share of the host's cores
for TensorFlow's thread pools (or their own GPUs where the machine has enough). Their output is streamed
with a ``[worker k]`` prefix. The exit code is the chief's when every worker ends on its own; when one fails first,
it is that worker's (128 + N for a worker killed by signal N: 137 after a SIGKILL), and the others are stopped.
When several have ended by then, a worker killed by a signal is named before the peers that failed on its closed
connections.

Nothing is left running: each worker is its own process group, killed as a group when the launch ends,
and a worker whose launcher dies is killed by the kernel (PR_SET_PDEATHSIG). If a worker fails, the
others are stopped at once rather than left waiting in a collective. A worker that exits or has not
joined within ``--join-timeout`` seconds fails the launch with a message naming it (ClusterError, exit 2).

For real clusters, ``--print-tf-config node1,node2`` prints the TF_CONFIG each host needs; on Slurm,
``examples/slurm_multiworker.sbatch`` needs none (the allocation is read through SlurmClusterResolver).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import fileio, gpus, rundir, summary as summary_schema
from ..engine.devices import host_cores
from ..errors import ClusterError, ConfigError
from . import procs, spec, workers as workers_mod

# After the chief has finished, how long the other workers may take to exit before they are stopped.
AFTER_CHIEF_GRACE_S = 60.0
POLL_S = 0.1


# --- what to start ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    argv: list[str]                  # tftoolkit arguments for every worker ("train", ...)
    workers: int
    replicas_per_worker: int
    gpu_slices: list[list[str]] | None  # each worker's GPUs (CUDA_VISIBLE_DEVICES entries), or None on CPU


def plan(train_argv: list[str], config, workers: int, replicas_per_worker: int | None = None) -> Plan:
    """Check a launch request and work out each worker's arguments; ConfigError says what is wrong.

    ``train_argv``: the ``train ...`` command every worker runs; ``config``: the RunConfig it parses to.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be an integer >= 1, got {workers!r}")
    if replicas_per_worker is not None and replicas_per_worker < 1:
        raise ConfigError(f"--replicas-per-worker must be >= 1, got {replicas_per_worker}")
    argv = list(train_argv)
    if config.workers not in (1, workers):
        raise ConfigError(f"the train options say --workers {config.workers} but the launch has --workers {workers}")
    if config.gpus is not None and workers > 1:
        raise ConfigError("--gpus names one process's GPUs; with launch use --replicas-per-worker N and each worker "
                          "gets N GPUs of its own")
    n = replicas_per_worker
    if config.replicas is not None:
        if n is not None and config.replicas != workers * n:
            raise ConfigError(f"--replicas {config.replicas} (all workers' replicas) is not --workers {workers} x "
                              f"--replicas-per-worker {n}; give one or the other")
        if config.replicas % workers:
            raise ConfigError(f"--replicas {config.replicas} does not divide among {workers} workers")
        n = config.replicas // workers
    devices = gpus.ids()  # under CUDA_VISIBLE_DEVICES=4,5,6,7 the workers share GPUs 4-7, not 0-3
    if n is None:
        n = max(1, len(devices) // workers) if devices else 1
    slices = None
    if devices:
        if workers * n > len(devices):
            raise ConfigError(f"{workers} workers x {n} GPU(s) each need {workers * n} GPUs; this process may use "
                              f"{len(devices)} ({','.join(devices)})")
        slices = [devices[w * n:(w + 1) * n] for w in range(workers)]
    argv = argv + ["--workers", str(workers), "--replicas", str(workers * n)]
    return Plan(argv, workers, n, slices)


def ports_for(workers: int, base_port: int | None) -> list[int]:
    if base_port is None:
        return spec.free_ports(workers)
    if not 0 < base_port <= 65536 - workers:
        raise ConfigError(f"--base-port must leave room for {workers} ports below 65536, got {base_port}")
    ports = [base_port + k for k in range(workers)]
    for k, p in enumerate(ports):
        spec.check_port_free(p, f"worker {k}'s port, --base-port {base_port} + {k}; choose another "
                                       "--base-port or leave it out to use free ports")
    return ports


def worker_env(plan_: Plan, k: int, addresses: list[str], launch_dir: str, join_timeout: float) -> dict:
    env = dict(os.environ)
    env["TF_CONFIG"] = spec.tf_config(addresses, k)
    env[spec.ENV_LAUNCH_DIR] = launch_dir
    # The launcher watches the join itself and names the worker at fault; the worker's own watchdog is the
    # backstop, a little later, so that the launcher's message is the one printed.
    env[spec.ENV_JOIN_TIMEOUT] = str(join_timeout + 15)
    env[spec.ENV_LAUNCHER_PID] = str(os.getpid())
    env["PYTHONUNBUFFERED"] = "1"
    if plan_.gpu_slices is not None:
        env.update(gpus.child_env(plan_.gpu_slices[k]))
    else:
        # Workers on one machine share its cores: give each its share of TensorFlow's thread pools
        # (devices._configure_cpu_threads reads these), or K workers oversubscribe the host K times.
        share = max(1, host_cores() // plan_.workers)
        env.setdefault("TFTOOLKIT_INTRA_OP_THREADS", str(share))
        env.setdefault("TFTOOLKIT_INTER_OP_THREADS", str(max(2, share)))
    env.pop("SLURM_PROCID", None)  # these workers' cluster is the TF_CONFIG above, not an enclosing allocation
    return env


# --- running them ----------------------------------------------------------------------------------------
class _Worker:
    def __init__(self, k: int, cmd: list[str], env: dict, out, err, lock):
        self.k = k
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, text=True, errors="replace",
                                     bufsize=1)
        self.threads = [threading.Thread(target=self._pump, args=(s, d, lock), daemon=True)
                        for s, d in ((self.proc.stdout, out), (self.proc.stderr, err))]
        for t in self.threads:
            t.start()

    def _pump(self, stream, dest, lock):
        for line in stream:
            line = line.rstrip("\n")
            self.tail.append(line)
            with lock:
                dest.write(f"[worker {self.k}] {line}\n")
                dest.flush()

    def kill(self):
        procs.stop_group(self.proc)  # the whole group, at once: nothing the worker started survives
        for t in self.threads:
            t.join(timeout=5)

    def last_words(self) -> str:
        for line in reversed(self.tail):
            if "error" in line.lower() or "failed" in line.lower():
                return line.strip()
        return self.tail[-1].strip() if self.tail else "(no output)"


def exit_code(code: int) -> int:
    """A shell-style exit code: a worker killed by signal N reads as 128 + N."""
    return 128 - code if code < 0 else code


def after_failure(code: int) -> str:
    """What to do after a worker failed: exit code 2 is an error in what it was asked to do (a bad --dataset, say),
    which its own one-line message names and which a rerun would meet again; anything else may resume."""
    if code == 2:
        return "Its message above says what to fix; then run the command again"
    return "Run the same command again to resume from the last checkpoint."


def describe_exit(code: int) -> str:
    """How a worker process ended, from its return code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _failed(workers, codes, marker) -> list:
    """(worker, exit code) of each worker that ended without finishing its part (a diverged run that finished
    exits 1 on purpose)."""
    return [(w, c) for w, c in zip(workers, codes) if c not in (None, 0) and not marker("finished", w.k)]


def spawn(commands: list[list[str]], envs: list[dict], launch_dir: str, join_timeout: float,
          out=None, err=None) -> int:
    """Run one command per worker until they end; returns the chief's exit code, or that of the worker whose
    failure ended the run (see module docstring).

    ``launch_dir`` is where workers leave their started/joined/finished markers (workers.mark).
    """
    out, err = out or sys.stdout, err or sys.stderr
    lock = threading.Lock()
    workers: list[_Worker] = []
    t0 = time.monotonic()
    chief_done_at = None

    def marker(name, k):
        return os.path.exists(os.path.join(launch_dir, f"{name}-{k}"))

    try:
        for k, (cmd, env) in enumerate(zip(commands, envs)):
            workers.append(_Worker(k, cmd, env, out, err, lock))
        while True:
            codes = [w.proc.poll() for w in workers]
            if _failed(workers, codes, marker):
                time.sleep(0.3)  # let the reader threads take the last lines, and a peer's own end be seen
                codes = [w.proc.poll() for w in workers]
                # The cause first: a worker killed by a signal, whose peers then fail on its closed connections
                # (the first to fail in worker order used to be named: "worker 0 failed (exit code 1)").
                w, code = min(_failed(workers, codes, marker), key=lambda wc: (wc[1] >= 0, wc[0].k))
                if not marker("joined", w.k):
                    raise ClusterError(f"worker {w.k} {describe_exit(code)} before joining the cluster: "
                                       f"{w.last_words()}")
                with lock:
                    err.write(f"tftoolkit launch: worker {w.k} failed ({describe_exit(code)}); stopping the other "
                              f"workers. {after_failure(code)}\n")
                return exit_code(code)
            if all(c is not None for c in codes):
                return exit_code(codes[0])
            now = time.monotonic()
            if now - t0 > join_timeout and not all(marker("joined", w.k) for w in workers):
                never = [w.k for w in workers if not marker("started", w.k)]
                waiting = [w.k for w in workers if marker("started", w.k) and not marker("joined", w.k)]
                what = []
                if never:
                    what.append(f"worker(s) {', '.join(map(str, never))} never reached the rendezvous")
                if waiting:
                    what.append(f"worker(s) {', '.join(map(str, waiting))} waited for the others")
                raise ClusterError(f"the cluster did not form within --join-timeout {join_timeout:g} s: "
                                   f"{'; '.join(what)}. Raise --join-timeout if start-up is slow here")
            if codes[0] is not None and chief_done_at is None:
                chief_done_at = now
            if chief_done_at is not None and now - chief_done_at > AFTER_CHIEF_GRACE_S:
                with lock:
                    err.write(f"tftoolkit launch: the chief ended {AFTER_CHIEF_GRACE_S:g} s ago; stopping the "
                              "workers still running\n")
                return exit_code(codes[0])
            time.sleep(POLL_S)
    finally:
        for w in workers:
            w.kill()


def launch(train_argv: list[str], config, workers: int, replicas_per_worker: int | None = None,
           join_timeout: float = spec.DEFAULT_JOIN_TIMEOUT_S, base_port: int | None = None,
           out=None, err=None) -> int:
    """Start ``workers`` workers of ``tftoolkit <train_argv>`` (which parses to ``config``) here; returns the
    chief's exit code, or the first failed worker's (spawn). The workers' output goes to ``out`` / ``err``
    (default: this process's)."""
    if not join_timeout > 0:
        raise ConfigError(f"--join-timeout must be > 0 seconds, got {join_timeout}")
    p = plan(train_argv, config, workers, replicas_per_worker)
    ports = ports_for(workers, base_port)
    addresses = [f"localhost:{port}" for port in ports]
    launch_dir = tempfile.mkdtemp(prefix="tftoolkit-launch-")
    try:
        cmd = [sys.executable, "-m", "tftoolkit", *p.argv]
        envs = [worker_env(p, k, addresses, launch_dir, join_timeout) for k in range(workers)]
        (err or sys.stderr).write(f"tftoolkit launch: {workers} worker(s) x {p.replicas_per_worker} replica(s) on "
                                  f"{', '.join(addresses)} (worker 0 is the chief)\n")
        return spawn([cmd] * workers, envs, launch_dir, join_timeout, out=out, err=err)
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)


def train_here(config, out, *, force: bool = False, quiet: bool = False) -> dict:
    """``tftoolkit.train`` of a config with workers > 1 and no cluster around: launch them here, wait, and
    return the summary the chief wrote. The workers read the config itself from a file (``train --config``), not
    a re-spelling of it as options."""
    with tempfile.TemporaryDirectory(prefix="tftoolkit-config-") as folder:
        path = Path(folder) / "config.json"
        fileio.write_json(path, rundir.config_record(config.to_dict()))  # a run directory's config.json, as written
        argv = ["train", "--out", str(out), "--config", str(path)] + (["--force"] if force else []) \
            + (["--quiet"] if quiet else [])
        code = launch(argv, config, config.workers, join_timeout=workers_mod.join_timeout())
    summary = Path(out) / "summary.json"
    if summary.exists():
        s = summary_schema.read(summary)
        if code == 0 or s.get("status") != "ok":
            return s
    raise ClusterError(f"the {config.workers}-worker run in {out} failed (exit code {code}); the workers' output "
                       f"above says why. {after_failure(code)}")


def tf_config_lines(hosts: str, workers: int | None, base_port: int | None) -> str:
    """The shell lines that give each of ``hosts`` its TF_CONFIG (``tftoolkit launch --print-tf-config``)."""
    pairs = spec.tf_configs_for_hosts(hosts, base_port or spec.DEFAULT_BASE_PORT)
    if workers is not None and workers != len(pairs):
        raise ConfigError(f"--workers {workers} but --print-tf-config names {len(pairs)} host(s)")
    lines = [f"# worker {k}{' (chief)' if k == 0 else ''}, on {host}:\nexport TF_CONFIG='{text}'\n"
             for k, (host, text) in enumerate(pairs)]
    lines.append(f"# then on every host, the same command: tftoolkit train --workers {len(pairs)} [options] --out RUN_DIR\n"
                 "# (--replicas counts all workers' replicas; RUN_DIR on a filesystem every host sees, for resuming)\n")
    return "".join(lines)


def stop_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt in the launcher, so that it stops its workers before it exits."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
