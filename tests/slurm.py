"""A real one-node Slurm for tests: munged, slurmctld and slurmd on localhost, in a temporary folder.

    with Slurm(workdir) as cluster:     # sets SLURM_CONF in os.environ while it runs
        subprocess.run(["sbatch", ...], env=cluster.env)

Debian's ``slurm-wlm`` and ``munge`` (22.05 here), run as root: munged as user ``munge`` on a private socket and
key, a slurm.conf with SlurmUser=root, process tracking without cgroups (linuxproc), no task plugin and no
accounting, one node with every CPU, oversubscribed, on free ports; state, spool and logs under ``workdir``.
Every daemon runs in the foreground as a child of this process, so stopping them is killing the pids started
here. Where Slurm is missing or this is not root, ``unavailable()`` says why and the fixture skips.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")


def _find(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None)


def unavailable() -> str | None:
    """Why a local Slurm cannot run here, or None."""
    missing = [n for n in DAEMONS + CLIENTS if _find(n) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; Debian: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd runs jobs as their users)"
    try:
        import pwd

        pwd.getpwnam("munge")
    except KeyError:
        return "there is no 'munge' user (the munge package creates it)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Slurm:
    def __init__(self, workdir: Path, timeout: float = 60.0):
        # Short: the munge socket's path must fit in a sockaddr_un (108 bytes).
        self.dir = Path(workdir)
        self.timeout = timeout
        self.procs: list[subprocess.Popen] = []
        self.node = socket.gethostname().split(".")[0]
        self.partition = "debug"

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> "Slurm":
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)  # munged runs as user munge and must reach its folder (mkdtemp makes 0700)
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        munge = d / "munge"
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(munge, 0o700)
        os.chmod(key, 0o400)
        shutil.chown(munge, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        self.socket = munge / "socket"
        log = open(d / "log" / "daemons.log", "a")
        self._log = log
        self._start([_find("munged"), "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
                     f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                     f"--seed-file={munge / 'munged.seed'}"], user="munge", group="munge")
        self._wait(lambda: self.socket.exists(), "munged's socket")
        ctld_port, d_port = _free_ports(2)
        cpus = os.cpu_count() or 1
        self.conf = d / "slurm.conf"
        self.conf.write_text(f"""\
ClusterName=tftoolkit-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'log' / 'slurmctld.log'}
SlurmdLogFile={d / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=3600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
        env = self.env
        self._start([_find("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=env)
        self._start([_find("slurmd"), "-D", "-f", str(self.conf), "-N", self.node], env=env)
        os.environ["SLURM_CONF"] = str(self.conf)

        def idle():
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=env)
            return done.returncode == 0 and done.stdout.strip() in ("idle", "mix", "alloc")

        self._wait(idle, "the node to be idle in sinfo")
        return self

    def _start(self, cmd, **kw) -> None:
        self.procs.append(subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True, **kw))

    def _wait(self, ok, what: str) -> None:
        deadline = time.time() + self.timeout
        while not ok():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.time() > deadline:
                self.__exit__()
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((self.dir / "log").glob("*"))
                                 + [self.dir / "munge" / "munged.log"] if p.exists())
                raise RuntimeError(f"local Slurm: waited for {what}; " +
                                   (f"{', '.join(dead)} exited" if dead else "timed out") + f"\n{logs}")
            time.sleep(0.3)

    def run(self, *cmd, check=True, **kw) -> subprocess.CompletedProcess:
        done = subprocess.run(list(cmd), capture_output=True, text=True, env=kw.pop("env", self.env), **kw)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done

    def wait_idle(self, timeout: float = 300) -> None:
        """Until no job is pending or running."""
        deadline = time.time() + timeout
        while self.run("squeue", "-h", "-o", "%i").stdout.strip():
            if time.time() > deadline:
                raise TimeoutError("jobs still in squeue:\n" + self.run("squeue").stdout)
            time.sleep(0.5)

    def _stepds(self) -> list[int]:
        """slurmstepd processes of this cluster (they outlive slurmd): those with a file open under its folder."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() != "slurmstepd":
                    continue
                if any(str(self.dir) in os.readlink(fd) for fd in (entry / "fd").iterdir()):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def __exit__(self, *exc) -> None:
        if os.environ.get("SLURM_CONF") == str(getattr(self, "conf", "")):
            del os.environ["SLURM_CONF"]
        if self.procs and all(p.poll() is None for p in self.procs):
            # Jobs a failing test left behind: cancel them while slurmctld is there to do it.
            try:
                self.run("scancel", "--partition", self.partition, check=False, timeout=30)
                self.wait_idle(30)
            except (TimeoutError, RuntimeError, subprocess.TimeoutExpired):
                pass
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs.clear()
        for pid in self._stepds():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if getattr(self, "_log", None):
            self._log.close()
