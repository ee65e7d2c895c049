"""The run directory: the interface between training and everything that reads results.

RUN_DIR/ config.json  summary.json  steps.csv  evals.csv  env.json  monitor.csv  checkpoints/  .lock

What a run directory is: a folder whose config.json carries ``"written_by": "tftoolkit"`` (``MARK``), which only
this toolkit writes (``config_record``; a sweep's sweep.json carries the same mark). A config.json without it (a
Keras ``model.to_json()``, a hand-made ``{"config": {}}``) is the user's, and the folder is never cleared or reused.

Every file is written atomically (``fileio``: temp file in the same folder, then rename), so a killed run
never leaves a half-written summary; readers see the old file or the new one.

A process working in a run directory (or a sweep folder) holds its ``.lock``: an OS lock (flock) on that
file, opened without following a link (a planted link or non-regular ``.lock`` is refused in one line), which
records who holds it (pid, host, command, start time) and is refreshed every few seconds. A second process there gets a one-line RunDirError naming the holder. The kernel drops the lock when its holder
dies, however it dies; the next process then takes it over, with a warning naming the dead holder.
A process that wrote nothing there (it refused the folder, or stopped before it began) removes the lock file and
folder it made: a refused command leaves a folder as it found it.

On one host this is exact; across hosts, where the shared filesystem carries flock (NFSv4; Lustre and GPFS mounted
with flock). Where flock is local to each host, another host's process sees the record: it refuses while the record
names another host and was refreshed within ``STALE_AFTER_S``, and takes over (with a warning) after that, as it
does the lock of a holder there that stopped refreshing without dying (a frozen node).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import stat
import sys
import threading
import time
from pathlib import Path

from .config import AUTO_KEYS, NON_IDENTITY_KEYS, RunConfig
from .errors import RunDirError
from .fileio import DISK_ERRNOS, ensure_dir, read_json, remove_stale_temps

log = logging.getLogger("tftoolkit")

LOCK_FILE = ".lock"
HEARTBEAT_S = 5.0      # how often a holder refreshes its record
STALE_AFTER_S = 60.0   # a record from another host older than this is a holder that is gone
RECORD_WAIT_S = 1.0    # how long a refused process waits for a holder that has the lock to write its record
COMMAND_CHARS = 2000   # the holder's command as recorded; a longer one is cut and the cut marked
MARK = {"written_by": "tftoolkit"}  # what only this toolkit writes (a "config" object alone: Keras' to_json has one)


def config_record(config: dict, **more) -> dict:
    """config.json's content for a run of ``config`` (with ``more`` beside it): marked as the toolkit's."""
    return {**MARK, "config": config, **more}


def marked(doc) -> bool:
    """Whether ``doc`` (a parsed config.json or sweep.json) was written by this toolkit."""
    return isinstance(doc, dict) and all(doc.get(k) == v for k, v in MARK.items())


def identity(config_dict: dict, like: dict | None = None) -> dict:
    """What defines the run: every field but NON_IDENTITY_KEYS; with ``like`` (the run it is compared with), an
    AUTO_KEYS field left unset (None) takes ``like``'s value, which is what it was decided to be there."""
    out = {k: v for k, v in config_dict.items() if k not in NON_IDENTITY_KEYS}
    if like is not None:
        for k in AUTO_KEYS:
            if out.get(k) is None and k in like:
                out[k] = like[k]
    return out


def config_defaults() -> dict:
    """Every RunConfig field's default: what a run directory written before a field existed ran with."""
    return {f.name: f.default for f in dataclasses.fields(RunConfig)}


def path(out, what: str = "run directory") -> Path:
    """``out`` as a Path; an empty one (an unset shell variable) is refused: Path("") is the working folder."""
    if out is None or not str(out).strip():
        raise RunDirError(f"--out is empty (an unset variable?); give the {what}'s path")
    return Path(out)


def _run_config(cfg_path: Path) -> dict | None:
    """The config a run recorded in ``cfg_path`` (carrying ``MARK``), or None when the file is not a run's."""
    try:
        old = read_json(cfg_path)
    except (OSError, ValueError):
        return None
    # A run directory written before a config field existed ran with that field's default.
    return {**config_defaults(), **old["config"]} if marked(old) and isinstance(old.get("config"), dict) else None


def trained(out: Path) -> bool:
    """Whether the run in ``out`` trained a step that it recorded: a checkpoint (an index file, as
    engine/checkpoint.py writes them), or a summary of steps trained. One that stopped at set-up (a mistake in its
    options) has neither, and holds nothing a rerun could resume or a reader could use."""
    if any((Path(out) / "checkpoints").glob("ckpt-*.index")):
        return True
    summary = Path(out) / "summary.json"
    if not summary.exists():
        return False
    try:
        steps = read_json(summary).get("steps")
    except (OSError, ValueError, AttributeError):
        return True  # not known: kept
    return steps != 0


def prepare(out, config_dict: dict, force: bool = False) -> tuple[Path, bool]:
    """Create or reopen ``out`` for this config; returns (path, resuming).

    A run directory is recognised by its config.json (a run's config, written when it starts, carrying ``MARK``). One
    holding a different run is refused (naming the keys that differ) unless ``force``, which clears it; a different run that
    never trained a step (``trained``) is cleared without it: it is what the corrected command replaces. The same config
    means: resume from its last checkpoint. Anything else that is not empty (a folder of the user's own files,
    a sweep folder, a config.json of another kind) is refused, ``force`` or not: it is never deleted.
    """
    out = path(out)
    cfg_path = out / "config.json"
    if cfg_path.exists():
        old = _run_config(cfg_path)
        if old is None:
            raise RunDirError(f"{out} is not a tftoolkit run directory: its config.json is not a run's (a run's "
                              "carries \"written_by\": \"tftoolkit\"), so it is left as it is; choose another --out")
        if identity(old) == identity(config_dict, like=old):
            remove_stale_temps(out)  # ours, and locked: what a killed writer left goes (never in a folder refused)
            return out, True
        if not force and trained(out):
            a, b = identity(old), identity(config_dict, like=old)
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            why = "it differs in " + ", ".join(f"{k} ({old.get(k)!r} there, {config_dict.get(k)!r} now)" for k in diff)
            raise RunDirError(f"{out} holds a different run ({why}); choose another --out or pass --force to overwrite it")
        if not force:
            log.info("%s held a run of another config that never trained a step (it stopped at set-up); replacing it",
                     out)
        clear(out)
    elif out.exists() and _contents(out):
        raise RunDirError(f"{out} exists and is not a tftoolkit run directory (it holds no config.json), so it is "
                          "left as it is; choose another --out: a new or empty folder")
    ensure_dir(out, "run directory")
    return out, False


def _contents(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name != LOCK_FILE]


def clear(folder: Path) -> None:
    """Delete what ``folder`` holds, but not its lock file: the lock held on it stays held (--force)."""
    for p in _contents(Path(folder)):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


# --- the lock ------------------------------------------------------------------------------------------------
def _alive(pid: int, started: float | None) -> bool:
    """Whether process ``pid`` on this host runs, and is the one that started at ``started`` (pids are reused)."""
    try:
        import psutil  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

        proc = psutil.Process(pid)
        return started is None or abs(proc.create_time() - started) < 1.0
    except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied (then it runs), no psutil
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _lock_holder(record: dict) -> str:
    """Who holds a lock, from its record: the process, its host, since when and its command."""
    started = record.get("started_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')} since {when} ({record.get('command', '?')})"


class Lock:
    """The lock on ``folder`` (a run directory or a sweep folder) for this process; see the module docstring."""

    def __init__(self, folder, what: str = "run directory"):
        self.folder, self.what = path(folder, what), what
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None
        self._flocked = False
        self._created = False     # this process made the folder
        self._made_file = False   # this process made the lock file
        self._found: set[str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> dict:
        try:
            import psutil  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

            started = psutil.Process().create_time()
        except Exception:  # noqa: BLE001
            started = None
        command = " ".join(" ".join(sys.argv).split())  # one line, however the arguments were quoted
        command = command or "python"
        if len(command) > COMMAND_CHARS:  # a cut is marked: a shorter --out would name another folder
            command = command[:COMMAND_CHARS - 1] + "…"
        return {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                "started_at": time.time(), "pid_started": started}

    def _read(self) -> dict:
        try:
            text = os.pread(self._fd, 1 << 16, 0).decode(errors="replace").strip()
            record = json.loads(text) if text else {}
            return record if isinstance(record, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write(self, record: dict) -> None:
        data = json.dumps(record).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.fsync(self._fd)

    def _open(self) -> bool:
        """Open the lock file, creating it if there is none; False when it vanished as it was opened (retry)."""
        try:
            ensure_dir(self.folder, self.what)
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                self._made_file = True
            except FileExistsError:
                # A .lock planted as a link would have this process truncate the file it points to (O_NOFOLLOW).
                self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
                self._made_file = False
                if not stat.S_ISREG((st := os.fstat(self._fd)).st_mode) or st.st_nlink != 1:  # a hard link too
                    self._close()
                    raise OSError(errno.ELOOP, "not a regular file")
        except FileNotFoundError:
            return False
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR):  # a symbolic link, or not a regular file
                raise RunDirError(f"{self.path} is a link or not a file: not a lock this toolkit made; it is "
                                  "left as it is: remove it (or choose another folder), then run again") from None
            if e.errno in DISK_ERRNOS or e.errno == errno.EACCES:
                raise RunDirError(f"cannot write {self.path}: {os.strerror(e.errno)} ({errno.errorcode[e.errno]}); "
                                  f"a {self.what} must be writable: choose another folder") from None
            raise
        return True

    def _is_the_lock_file(self) -> bool:
        """Whether the file we opened is still the one at ``path``: a holder that wrote nothing deletes it on release."""
        try:
            here, ours = os.stat(self.path, follow_symlinks=False), os.fstat(self._fd)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) == (ours.st_dev, ours.st_ino)

    def acquire(self) -> "Lock":
        self._created = not self.folder.exists()
        deadline = time.monotonic() + RECORD_WAIT_S
        for _ in range(1000):
            if not self._open():
                continue
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._flocked = True
            except BlockingIOError:
                holder = self._read()
                self._close()
                if "pid" not in holder and time.monotonic() < deadline:
                    # The holder has just taken it (or is releasing it) and its record is empty or half written:
                    # look again in a moment rather than name a holder from nothing.
                    time.sleep(0.05)
                    continue
                who = (f"is locked by {_lock_holder(holder)}" if "pid" in holder else
                       "is being taken by another process right now (its lock record is not written yet)")
                raise RunDirError(f"{self.folder} is in use: this {self.what} {who}; wait for it to end or stop that "
                                  "process (--force never breaks a live lock)") from None
            except OSError as e:  # ENOLCK, EOPNOTSUPP: a filesystem without flock; the record still guards it
                log.warning("%s: the filesystem does not support flock (%s); relying on the lock file's record alone",
                            self.folder, e.strerror)
            if self._is_the_lock_file():
                break
            # Its holder deleted it while we opened it, and another process may hold a new one: open that.
            self._unlock()
            self._close()
        else:
            raise RunDirError(f"{self.folder}: the lock file {self.path} keeps changing under this process; "
                              "another process keeps taking this folder: stop it, then run again")
        previous = self._read()
        if previous:
            self._check_previous(previous)
        self._write(self._record())
        # What the folder held when this process made the lock file: if that is all it holds at release, this
        # process wrote nothing here (it refused the folder, or stopped before it began) and removes its lock file.
        self._found = {p.name for p in _contents(self.folder)} if self._made_file else None
        self._thread = threading.Thread(target=self._heartbeat, name="tftoolkit-lock", daemon=True)
        self._thread.start()
        return self

    def _check_previous(self, previous: dict) -> None:
        """We hold the flock, but the file names a holder: it died, or it is on another host (see the docstring)."""
        here = socket.gethostname()
        if previous.get("host") == here:
            # With the flock ours, a holder on this host cannot hold it any more: it died without releasing it.
            # Without flock (a filesystem that lacks it) the record is all there is: a live pid holds it.
            if not self._flocked and _alive(int(previous.get("pid", 0)), previous.get("pid_started")):
                self._close()
                raise RunDirError(f"{self.folder} is in use: this {self.what} is locked by {_lock_holder(previous)}")
            log.warning("%s: taking over the lock of %s, which is no longer running", self.folder, _lock_holder(previous))
            return
        age = time.time() - os.fstat(self._fd).st_mtime
        if age < STALE_AFTER_S:
            self._close()
            raise RunDirError(f"{self.folder} is in use: this {self.what} is locked by {_lock_holder(previous)}, whose "
                              f"record was refreshed {age:.0f} s ago (a holder on another host of a shared filesystem); "
                              f"wait for it to end, or stop it there")
        log.warning("%s: taking over the lock of %s: another host, silent for %.0f s (longer than %.0f s)", self.folder,
                    _lock_holder(previous), age, STALE_AFTER_S)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass

    def _unlock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            pass

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)  # an empty record: the next holder has nothing to warn about
                if self._found is not None and {p.name for p in _contents(self.folder)} == self._found:
                    # Nothing was written: leave the folder as it was found (no lock file, no folder it made).
                    os.unlink(self.path)
                    if self._created:
                        self.folder.rmdir()
            except OSError:
                pass
            self._unlock()
            self._close()

    def __enter__(self) -> "Lock":
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def held(folder) -> bool:
    """Whether a live process holds ``folder``'s lock: a reader's question (is a sweep working there now?).

    By flock, and across hosts where flock is local to each host by the record, as ``Lock`` decides it."""
    lock_path = Path(folder) / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a planted link is no holder
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # no flock on this filesystem: the record alone
            return os.fstat(fd).st_size > 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        try:
            record = json.loads(os.pread(fd, 1 << 16, 0).decode(errors="replace") or "{}")
        except ValueError:
            return False
        return (isinstance(record, dict) and record.get("host") not in (None, socket.gethostname())
                and time.time() - os.fstat(fd).st_mtime < STALE_AFTER_S)
    finally:
        os.close(fd)


def lock(folder, what: str = "run directory") -> Lock:
    """Hold the lock on ``folder`` for this process: ``with rundir.lock(out): ...``. RunDirError when busy."""
    return Lock(folder, what).acquire()
