"""A TFRecord dataset's manifest.json (data/tfrecords.py writes and reads the shards), and the check of its shards
against it: present, not truncated, the right number of records, the right sha256 (``verify``: every run, once per
shard until it changes, or not at all). Anything wrong is a DataError naming the file and how to make it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from pathlib import Path

from ..config import VERIFY_MODES
from ..errors import DataError
from ..fileio import write_json

log = logging.getLogger("tftoolkit")

MANIFEST = "manifest.json"
FORMAT = "tftoolkit-tfrecord"
FORMAT_VERSION = 1
ENCODINGS = ("raw", "png", "jpeg")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def redo_hint(path: Path, manifest: dict) -> str:
    cmd = (manifest.get("generator") or {}).get("command")
    return f"re-create it with `{cmd} --out {path} --force`" if cmd else "copy the dataset again from its source"


def read_manifest(path) -> dict:
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.exists():
        raise DataError(f"{path} has no {MANIFEST}; a TFRecord dataset folder needs one (see data/README.md)")
    try:
        manifest = json.loads(mpath.read_text())
    except ValueError as e:
        raise DataError(f"{mpath} is not valid JSON ({e}); re-create the dataset") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits", {}), dict):
        raise DataError(f"{mpath} is not a manifest (an object with image_shape, num_classes and splits); see "
                        "data/README.md for the format")
    missing = [k for k in ("image_shape", "num_classes", "splits") if k not in manifest]
    if missing or "train" not in manifest.get("splits", {}):
        raise DataError(f"{mpath} lacks {', '.join(missing) or 'a train split'}; see data/README.md for the format")
    enc = manifest.get("image_encoding", "raw")
    if enc not in ENCODINGS:
        raise DataError(f"{mpath}: image_encoding {enc!r} is not one of {', '.join(ENCODINGS)}")
    check_classes(mpath, manifest["num_classes"])
    for split, spec in manifest["splits"].items():
        shards = spec.get("shards") if isinstance(spec, dict) else None
        if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str)
                                                   for s in shards):
            raise DataError(f"{mpath}: split {split!r} needs a list of shards, each {{\"file\": ...}}; see "
                            "data/README.md for the format")
        for shard in shards:
            check_shard_path(mpath, shard["file"])
    return manifest


# A classifier's last layer holds num_classes x its input width weights (and the optimizer as many again): past
# this many classes it cannot fit any device, so a manifest declaring more is refused before anything trains.
MAX_CLASSES = 1_000_000


def check_classes(mpath: Path, n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CLASSES:
        raise DataError(f"{mpath}: num_classes {n!r} must be a whole number from 1 to {MAX_CLASSES:,} (a classifier "
                        f"head over more classes cannot fit in memory); correct the manifest")


def check_shard_path(mpath: Path, name: str) -> None:
    """The rule for what a manifest may name: a shard is a relative path inside the dataset's folder (no absolute
    path, no ``..``), so a dataset copied from elsewhere cannot make a run open files outside it."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or "\0" in name:
        raise DataError(f"{mpath}: shard {name!r} is not a path inside the dataset's folder (a shard is named "
                        "relative to the folder that holds manifest.json, without '..'); correct the manifest")


def check_framing(path: Path) -> int:
    """Number of records in a TFRecord file; DataError if the file ends inside a record (truncated)."""
    size = path.stat().st_size
    n, pos = 0, 0
    with open(path, "rb") as f:
        while pos < size:
            header = f.read(12)  # uint64 length + uint32 masked crc of the length
            if len(header) < 12:
                raise DataError(f"{path} is truncated: it ends inside the header of record {n} (at byte {pos} of "
                                f"{size}); the copy or download was cut short")
            (length,) = struct.unpack("<Q", header[:8])
            end = pos + 12 + length + 4  # data + uint32 masked crc of the data
            if end > size:
                raise DataError(f"{path} is truncated: record {n} needs bytes up to {end} but the file has {size}; "
                                "the copy or download was cut short")
            pos = end
            f.seek(pos)
            n += 1
    return n


VERIFIED = "verified.json"  # beside the manifest: what the last check of each shard found (size, mtime, sha256)


def shard_stamp(f: Path) -> dict:
    st = f.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def passed_entry(f: Path, records: int, sha: str | None) -> dict:
    """What verified.json records of a shard that passed: its size and mtime then, its records and sha256."""
    return {**shard_stamp(f), "records": records, "sha256": sha}


def verify(path, manifest: dict, mode: str = "cached") -> float:
    """Check every shard against the manifest; returns seconds. ``mode``:

    full    every shard read: framing (not truncated), record count, sha256;
    cached  as full, except shards whose size and modification time are those recorded the last time they
            passed (``verified.json`` in the dataset folder, next to the manifest): a 100-GB dataset is hashed
            once, not on every run. A shard rewritten in place with the same size and mtime would pass unseen;
            use ``full`` after copying data with tools that preserve times;
    off     only that every shard exists (a damaged record still fails the record scan, with its file named).
    """
    if mode not in VERIFY_MODES:
        raise DataError(f"verify: unknown value {mode!r}; choose one of {', '.join(VERIFY_MODES)}")
    path = Path(path)
    t0 = time.perf_counter()
    hint = redo_hint(path, manifest)
    try:
        known = json.loads((path / VERIFIED).read_text()) if mode == "cached" else {}
    except (OSError, ValueError):
        known = {}
    passed, changed = {}, False
    for split, spec in manifest["splits"].items():
        for shard in spec["shards"]:
            f = path / shard["file"]
            if not f.exists():
                raise DataError(f"shard {shard['file']} named in {path / MANIFEST} is missing; {hint}")
            if mode == "off":
                continue
            stamp = shard_stamp(f)
            entry = known.get(shard["file"])
            if (entry and {k: entry.get(k) for k in stamp} == stamp and entry.get("sha256") == shard.get("sha256")
                    and ("records" not in shard or entry.get("records") == shard["records"])):
                shard["records"] = entry["records"]
                passed[shard["file"]] = entry
                continue
            records = check_framing(f)
            if "records" in shard and records != shard["records"]:
                raise DataError(f"shard {f} has {records} records but the manifest says {shard['records']}; {hint}")
            shard["records"] = records  # a hand-written manifest may leave the counts out
            if shard.get("sha256") and sha256(f) != shard["sha256"]:
                raise DataError(f"shard {f} does not match the sha256 in the manifest (changed or corrupt); {hint}")
            passed[shard["file"]] = passed_entry(f, records, shard.get("sha256"))
            changed = True
    if mode != "off" and (changed or set(passed) != set(known)):
        try:
            write_json(path / VERIFIED, passed)
        except OSError as e:  # a read-only dataset folder: check in full next time, say why once
            log.info("cannot record the shard check in %s (%s); the next run checks again", path / VERIFIED,
                     e.strerror or e)
    return time.perf_counter() - t0


def read_manifest_if_valid(path, mode: str = "cached") -> dict | None:
    """The manifest if ``path`` holds a complete, verified dataset; None otherwise (no error)."""
    try:
        manifest = read_manifest(path)
        verify(path, manifest, mode)
        return manifest
    except DataError:
        return None
