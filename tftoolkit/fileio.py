"""Atomic file writes: every file the toolkit writes goes through ``atomic_write``.

A file is written to a temporary name in the same folder, flushed to disk, then renamed over the target
(``os.replace`` is atomic on POSIX filesystems), so a reader, or a rerun after a SIGKILL, sees either the
old file or the new one, never half of one. JSON, CSV, figures, reports and dataset shards all use it.

A full disk, a quota or a read-only filesystem is the user's to fix, not a bug: it becomes a one-line
RunDirError (exit 2 from the CLI) naming the file, and the last complete file stays where it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import RunDirError

DISK_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT)
# Every temporary file ``replacing`` makes is named .<file>.tftoolkit-<random>.tmp: what a killed writer leaves is
# recognised by the name only this toolkit gives (a user's own .*.tmp files are never removed).
TEMP_TAG = "tftoolkit-"


def cache_folder() -> Path:
    """The toolkit's cache of results it can compute again: the planner's kept results, the host CPU's measured
    peak. ``$TFTOOLKIT_CACHE``, else ``$XDG_CACHE_HOME/tftoolkit``, else ``~/.cache/tftoolkit`` (prepared datasets
    have a home of their own, data/home.py, under the same default folder)."""
    if os.environ.get("TFTOOLKIT_CACHE"):
        return Path(os.environ["TFTOOLKIT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tftoolkit"


def ensure_dir(path, what: str = "output folder") -> Path:
    """Make folder ``path`` (and its parents) or say in one line why it cannot be: a file where the folder or one
    of its parents should be, no permission, a read-only or full filesystem (RunDirError: exit 2 from the CLI).
    Every folder the toolkit writes into (run directories, sweeps, finders' folders, notebooks' out_dir) is
    made here."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except FileExistsError:
        what_is = "a symbolic link that leads to no folder" if path.is_symlink() else "a file, not a folder"
        raise RunDirError(f"{path} is {what_is}: give the {what} a name that is free or a folder") from None
    except NotADirectoryError:
        parent = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        raise RunDirError(f"cannot make {path}: {parent} is a file, not a folder; give the {what} a path under a "
                          "folder") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunDirError(f"cannot make {path}: a loop of symbolic links; give the {what} another path") from None
        if e.errno in DISK_ERRNOS or e.errno in (errno.EACCES, errno.EPERM):
            raise RunDirError(f"cannot make {path}: {os.strerror(e.errno)} ({errno.errorcode[e.errno]}); the {what} "
                              "must be writable: choose another folder") from None
        raise


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replacing(path, *, public: bool = True):
    """A temporary path next to ``path`` for a writer that needs a file name (a TFRecordWriter, say).

    On a clean exit the file is flushed to disk and renamed over ``path``; on an exception it is deleted
    and ``path`` is left as it was. ``public``: give the file the usual permissions (0666 less the umask),
    since ``mkstemp`` makes private 0600 files and run directories, figures and reports are for others too.
    """
    path = Path(path)
    tmp = None
    try:
        ensure_dir(path.parent, "folder of " + path.name)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{TEMP_TAG}", suffix=".tmp")
        os.close(fd)
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if public:
            os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        if e.errno in DISK_ERRNOS:
            raise RunDirError(f"cannot write {path}: {os.strerror(e.errno)} ({errno.errorcode[e.errno]}); the last "
                              "complete copy is kept; free space or choose a writable folder, then run the same "
                              "command again") from None
        raise
    except BaseException:
        _remove(tmp)
        raise


def remove_stale_temps(folder) -> list[Path]:
    """Delete the temporary files ``replacing`` leaves in ``folder`` when its writer is killed mid-write.

    Only safe while no live writer can be in ``folder``: call it holding the folder's lock, once the folder is known
    to be one this toolkit writes (a run directory, a sweep folder, a checkpoints folder, a dataset being written).
    Only names ``replacing`` gives are removed, and a link is removed as a link.
    """
    removed = []
    for tmp in Path(folder).glob(f".*.{TEMP_TAG}*.tmp"):
        if tmp.is_file() or tmp.is_symlink():
            _remove(tmp)
            removed.append(tmp)
    return removed


def _remove(tmp) -> None:
    if tmp is not None and os.path.exists(tmp):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def atomic_write(path, content: str | bytes | Callable, *, binary: bool | None = None, public: bool = True) -> Path:
    """Write ``content`` (text, bytes, or a function that writes into the open file) to ``path`` atomically."""
    if binary is None:
        binary = isinstance(content, (bytes, bytearray))
    with replacing(path, public=public) as tmp:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            if callable(content):
                content(f)
            else:
                f.write(content)
    return Path(path)


def jsonable(obj):
    """Plain Python values for strict JSON: NumPy scalars and arrays become numbers and lists, and a number that is
    not finite (NaN for unknown, or an infinite bound) becomes None, since strict JSON has neither."""
    import numpy as np  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path, obj: Any) -> Path:
    """``obj`` as strict JSON (RFC 8259: what JavaScript's JSON.parse and other strict readers accept), atomically:
    null where a number is NaN or infinite. ``summary.read`` gives a summary's unknown numbers back as NaN."""
    return atomic_write(path, lambda f: json.dump(jsonable(obj), f, indent=2, sort_keys=True, allow_nan=False))


def open_for_writing(path, mode: str = "w", **kwargs):
    """``open(path, mode)`` for a file written in place (a log, monitor.csv), without following a link at ``path``: a
    link planted there would have the toolkit truncate or append to the file it points to (one line, exit 2)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunDirError(f"{path} is a symbolic link; the toolkit writes its own file there and does not follow "
                              "links: remove it, then run again") from None
        raise
    return os.fdopen(fd, mode, **kwargs)


def read_json(path) -> Any:
    with open(path) as f:
        return json.load(f)


def write_csv(path, frame) -> Path:
    """Write a pandas DataFrame as CSV, atomically."""
    return atomic_write(path, lambda f: frame.to_csv(f, index=False))


def size_text(nbytes: float) -> str:
    """A byte count as people read it, with the digits that say something: 1.25 GB, 5.2 MB, 900 kB (never a budget
    of 1 MB printed as "0.00 GB")."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            value = nbytes / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{nbytes:.0f} B"
