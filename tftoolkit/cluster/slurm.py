"""Slurm from the submitting side: write and sbatch a job array, ask squeue / scontrol what became of its
tasks, scancel; and whether a sweep folder is on a filesystem the nodes share. (What ``tftoolkit env`` says of
the allocation a process runs in is measure.hardware.slurm_allocation: it reads environment variables only.)

Why sbatch with a generated script, not submitit: a sweep point is already a command (``python -m
tftoolkit.experiments.sweep.task``) that writes its own record, so nothing needs pickling; the script lands in
the sweep folder, where a user can read it, resubmit it by hand or hand it to their site's support; job arrays
with ``%K`` throttling, ``--gres`` and any pass-through ``--sbatch-arg`` map one to one onto sbatch options; and
the dependency list stays as it is. submitit's value (pickled closures, its own result files) is what this
design does not need.

Slurm's state is read with the client commands every Slurm has (squeue for what is queued or running,
``scontrol show job`` for how a task ended while Slurm still remembers it, MinJobAge: 300 s by default);
``sacct`` needs a slurmdbd, which many small clusters lack, so it is not relied on.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ClusterError

NOT_FOUND = ("Slurm not found: there is no sbatch on PATH. Run the sweep on this machine with --backend local "
             "(the default), or from a login node of your Slurm cluster")
ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED", "STOPPED")
# Filesystems that cannot be seen from another node, and ones that are built to be.
LOCAL_ONLY = ("tmpfs", "ramfs", "devtmpfs", "overlay", "squashfs")
SHARED = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "cephfs", "glusterfs", "fuse.sshfs",
          "fuse.glusterfs", "fuse.ceph", "panfs", "wekafs", "fuse.juicefs", "9p", "virtiofs")


class SlurmError(ClusterError):
    """sbatch / squeue / scancel refused or failed: their own message, one line."""


def sbatch_path() -> str | None:
    return shutil.which("sbatch")


def require() -> None:
    if sbatch_path() is None:
        raise SlurmError(NOT_FOUND)


def _run(cmd: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SlurmError(NOT_FOUND) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{what}: `{' '.join(cmd[:2])}` did not answer in 120 s (is slurmctld up?)") from None
    if check and done.returncode != 0:
        msg = " ".join((done.stderr or done.stdout).split()) or f"exit code {done.returncode}"
        raise SlurmError(f"{what}: {msg}")
    return done


# --- submitting ---------------------------------------------------------------------------------------------
@dataclass
class ArrayOptions:
    """How each array task asks for resources. Every field maps onto one sbatch option."""

    max_concurrent: int | None = None   # --array=0-N%K
    gpus_per_task: int | None = None    # --gres=gpu:K
    time: str | None = None             # --time
    partition: str | None = None        # --partition
    account: str | None = None          # --account
    job_name: str = "tftoolkit-sweep"
    extra: list[str] = field(default_factory=list)  # --sbatch-arg, passed through as given

    def check(self) -> None:
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise SlurmError(f"--max-concurrent must be >= 1, got {self.max_concurrent}")
        if self.gpus_per_task is not None and self.gpus_per_task < 1:
            raise SlurmError(f"--gpus-per-run must be >= 1, got {self.gpus_per_task}")


def time_limit(timeout_s: float | None, given: str | None) -> str | None:
    """--time for a task: as given, else the sweep's --timeout plus 5 minutes of start-up and tear-down."""
    if given:
        return given
    if timeout_s:
        return str(int((timeout_s + 300 + 59) // 60))  # minutes
    return None


def array_script(command: list[str], n_tasks: int, opts: ArrayOptions, log_dir: Path, workdir: Path) -> str:
    """The sbatch script of an n-task array whose task i runs ``command + [i]``."""
    array = f"0-{n_tasks - 1}" + (f"%{opts.max_concurrent}" if opts.max_concurrent else "")
    lines = ["#!/bin/bash",
             "# Written by `tftoolkit sweep --backend slurm`: one array task per sweep point. Resubmitting this file",
             "# by hand works too; the sweep command does it for you and never submits a point twice.",
             f"#SBATCH --job-name={opts.job_name}",
             f"#SBATCH --array={array}",
             "#SBATCH --ntasks=1",
             f"#SBATCH --output={log_dir}/%A_%a.out",
             f"#SBATCH --chdir={workdir}"]
    if opts.time:
        lines.append(f"#SBATCH --time={opts.time}")
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    if opts.gpus_per_task:
        lines.append(f"#SBATCH --gres=gpu:{opts.gpus_per_task}")
    lines += [f"#SBATCH {a}" for a in opts.extra]
    lines += ["", "set -eu",
              # The environment is the submitter's (sbatch --export=ALL): same interpreter, PYTHONPATH, data home.
              "exec " + " ".join(shlex.quote(c) for c in command) + ' "$SLURM_ARRAY_TASK_ID"', ""]
    return "\n".join(lines)


def submit(script: Path) -> str:
    """sbatch the script; returns the job id. sbatch's own message on refusal (bad partition, account, ...)."""
    require()
    done = _run(["sbatch", "--parsable", str(script)], "sbatch refused the job")
    return done.stdout.strip().split(";")[0]


def cancel(job: str) -> None:
    _run(["scancel", str(job)], "scancel failed")


# --- asking what happened -----------------------------------------------------------------------------------
def active_tasks(jobs: list[str]) -> dict[tuple[str, int], str]:
    """{(array job id, task index): state} for every task of these arrays still queued or running."""
    if not jobs:
        return {}
    require()
    done = _run(["squeue", "-h", "-r", "-j", ",".join(jobs), "-o", "%F %K %T"], "squeue failed", check=False)
    if done.returncode != 0:
        if "Invalid job id" in (done.stderr or ""):
            return {}  # none of them is known any more: all finished long ago
        raise SlurmError("squeue failed: " + " ".join(done.stderr.split()))
    out = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2] in ACTIVE:
            out[(parts[0], int(parts[1]))] = parts[2]
    return out


def final_states(job: str) -> dict[int, dict]:
    """{task index: {"state", "reason", "exit_code", "time_limit"}} of an array, as far as Slurm remembers it."""
    done = _run(["scontrol", "-o", "show", "job", str(job)], "scontrol failed", check=False)
    if done.returncode != 0:
        return {}
    out = {}
    for line in done.stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("ArrayJobId") == str(job) and fields.get("ArrayTaskId", "").isdigit():
            out[int(fields["ArrayTaskId"])] = {"state": fields.get("JobState", ""), "reason": fields.get("Reason", ""),
                                               "exit_code": fields.get("ExitCode", ""),
                                               "time_limit": fields.get("TimeLimit", "")}
    return out


def describe_end(state: dict | None) -> tuple[str, str]:
    """(sweep status, error) for a task that ended without writing its result, from Slurm's record of it."""
    if not state:
        return "failed", ("no longer in Slurm's queue and no result written: cancelled before it started, or lost "
                          "with its node; see the slurm/ logs")
    s, reason = state["state"], state.get("reason") or "None"
    if s == "TIMEOUT" or s == "DEADLINE":
        return "timeout", f"Slurm stopped the task at its time limit ({state.get('time_limit')}; JobState={s})"
    if s == "CANCELLED":
        return "cancelled", f"cancelled in Slurm (scancel; Reason={reason})"
    if s == "COMPLETED":
        return "failed", "the task ended without writing its result; see its slurm/ log"
    return "failed", f"Slurm: JobState={s}, Reason={reason}, ExitCode={state.get('exit_code')}"


# --- the sweep folder must be visible from the nodes --------------------------------------------------------
def _mounts(text: str | None = None) -> list[tuple[str, str]]:
    if text is None:
        try:
            text = Path("/proc/mounts").read_text()
        except OSError:
            return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append((parts[1].replace("\\040", " "), parts[2]))
    return out


def filesystem_type(path: Path, mounts_text: str | None = None) -> str | None:
    """The type of the filesystem ``path`` is on (longest mount-point prefix of /proc/mounts)."""
    p = str(Path(path).resolve())
    best, kind = "", None
    for mnt, fstype in _mounts(mounts_text):
        if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, kind = mnt, fstype
    return kind


def partition_nodes(partition: str | None) -> int | None:
    cmd = ["sinfo", "-h", "-o", "%D"] + (["-p", partition] if partition else [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return sum(int(x) for x in done.stdout.split()) if done.returncode == 0 else None
    except ValueError:
        return None


def check_shared(path: Path, nodes: int | None, mounts_text: str | None = None) -> str | None:
    """A warning for a sweep folder the nodes may not see (None when fine); raises where it certainly cannot be."""
    if nodes is not None and nodes <= 1:
        return None  # one node: the folder is where the task runs
    kind = filesystem_type(path, mounts_text)
    where = f"{path} is on a {kind} filesystem"
    if kind in LOCAL_ONLY:
        raise SlurmError(f"{where}, which exists on this host only: array tasks on other nodes cannot write their "
                         "results there. Put --out on a filesystem every node mounts (home, project or scratch)")
    if kind is None or kind in SHARED or kind.startswith("fuse"):
        return None
    return (f"{where}, local to this host as far as it can tell: the sweep needs --out (and this Python "
            "environment) at the same path on every node; if the nodes do not mount it, their tasks fail")
