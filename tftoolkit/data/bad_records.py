"""Examples of a streamed split (data/stream.py) that do not parse or decode, or whose label is out of range.

Such an example fails the run, naming the shard and record or the file (``explain`` re-reads that one to say why),
unless ``skip_bad`` is set: then it is skipped, counted and named in summary.json (``skipped_images``) and in the
run's skipped-<split>.tsv, one row per example however many passes met it. Both work the same way (``checked``):
decoding keeps the stream's order, each element carries its position and its TAG_HISTORY predecessors' (shard,
record), and after ``ignore_errors`` a gap in the positions names what was dropped.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import numpy as np

from ..errors import first_line
from ..fileio import atomic_write
from .decode import JPEG_BROKEN, JPEG_CUT_SHORT, MARK, fit_fn
from .functions import plain

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

TAG_CHUNK = 64            # elements tagged per step of the bad-example check's bookkeeping
TAG_HISTORY = 8           # predecessors each element names: that many failing in a row are each named


def checked(split, ds, decode, per: int, sentinel: bool):
    """``ds`` (unit, record, data, epoch) decoded in order by ``decode``, what fails dropped and named (strict: fail
    the run; ``split.skip_bad``: log it and go on), and batched ``per`` examples (a finite dataset keeps its short
    last batch; an endless one has none).

    Before decoding, each element is tagged with its position and its TAG_HISTORY predecessors' (unit, record),
    a chunk at a time; after ``ignore_errors`` a gap of g between consecutive positions in a batch means the g
    elements before the survivor failed, and the survivor's history names them (the last TAG_HISTORY of them,
    when more failed in a row). A finite dataset ends with a sentinel that always decodes (and is dropped from
    its batch), so a failure at its very end is caught too. The tagging and the check run once per chunk and
    once per batch, not per image."""
    ds = _tagged(ds, sentinel)
    ds = _decoded(split, ds, decode, per, sentinel)
    return _gaps_named(split, ds, sentinel)


def _tagged(ds, sentinel: bool):
    """``ds`` with the sentinel at its end (when asked), each element tagged, a chunk at a time, with its position
    and its TAG_HISTORY predecessors' (unit, record): (pos, prev units, prev records, unit, record, data, epoch)."""
    import tensorflow as tf

    if sentinel:
        ds = ds.concatenate(tf.data.Dataset.from_tensors(
            (tf.constant(-1, tf.int64), tf.constant(-1, tf.int64), tf.constant(""), tf.constant(0, tf.int64))))
    k = TAG_HISTORY

    def tag(state, chunk):
        pos, hist_u, hist_r = state
        u, r = chunk[0], chunk[1]
        n = tf.shape(u, out_type=tf.int64)[0]
        all_u, all_r = tf.concat([hist_u, u], 0), tf.concat([hist_r, r], 0)
        window = tf.range(n)[:, None] + tf.range(k, dtype=tf.int64)[None, :]  # element i: the k before it
        prev_u, prev_r = tf.gather(all_u, window), tf.gather(all_r, window)
        return (pos + n, all_u[-k:], all_r[-k:]), (pos + tf.range(n), prev_u, prev_r) + tuple(chunk)

    none = tf.fill([k], tf.constant(-1, tf.int64))
    start = (tf.constant(0, tf.int64), none, none)
    return ds.batch(TAG_CHUNK).scan(start, plain(tag)).unbatch()


def _decoded(split, ds, decode, per: int, sentinel: bool):
    """The tagged elements decoded in order (the sentinel to a blank image labelled -1), those that fail dropped
    (``ignore_errors``), batched ``per``: (pos, prev units, prev records, images, labels)."""
    import tensorflow as tf

    def dec(pos, pu, pr, u, r, d, epoch):
        if not sentinel:
            image, label = decode(u, r, d, epoch)
        else:
            image, label = tf.cond(u < 0, lambda: (tf.zeros(split.shape, tf.uint8), tf.constant(-1, tf.int32)),
                                   lambda: decode(u, r, d, epoch))
        return pos, pu, pr, image, label

    ds = ds.map(plain(dec), num_parallel_calls=split.threads["decode_threads"], deterministic=True)
    return ds.ignore_errors().batch(per, drop_remainder=not sentinel)


def _gaps_named(split, ds, sentinel: bool):
    """(images, labels) batches, each batch's gaps in the positions named from its survivors' histories: logged
    (``split.skip_bad``) or failing the run; the sentinel dropped from its batch."""
    import tensorflow as tf

    files = tf.constant(split.units)
    skip_log = raw_log(split) if split.skip_bad else None

    def names(pu, pr):
        where = tf.gather(files, tf.maximum(pu, 0))
        if split.counts is None:
            return where
        return tf.strings.join([where, tf.fill(tf.shape(where), f": {split.what} "), tf.strings.as_string(pr)])

    def check(last, batch):
        """(the batch, the first gap's name and size): the state moves on whatever the batch holds, so a batch
        after a failed one is judged on its own."""
        pos, pu, pr, images, labels = batch
        gaps = pos - tf.concat([[last], pos[:-1]], 0) - 1
        bad = tf.where(gaps > 0)[:, 0]
        bad_u, bad_r, bad_gaps = tf.gather(pu, bad), tf.gather(pr, bad), tf.gather(gaps, bad)
        who, how_many = names(bad_u[:, -1], bad_r[:, -1]), bad_gaps  # each gap's last: its survivor's predecessor
        if skip_log is not None:
            with tf.control_dependencies([_log_skipped(skip_log, names(bad_u, bad_r), bad_gaps)]):
                images = tf.identity(images)
        if sentinel:
            keep = labels >= 0
            images, labels = tf.boolean_mask(images, keep), tf.boolean_mask(labels, keep)
        first = tf.concat([who, [""]], 0)[0], tf.concat([how_many, [0]], 0)[0]
        return pos[-1], (images, labels) + first

    def fail(images, labels, who, how_many):
        # Raised here, after the scan: its state has moved past this batch, so whatever pulls next (another
        # replica's prefetch) does not report the same loss again as a larger gap.
        ok = tf.debugging.Assert(how_many <= 0, [MARK, "does not parse or decode", who, how_many])
        with tf.control_dependencies([ok]):
            return tf.identity(images), tf.identity(labels)

    ds = ds.scan(tf.constant(-1, tf.int64), plain(check))
    if skip_log is not None:
        return ds.map(plain(lambda images, labels, who, how_many: (images, labels)))
    return ds.map(plain(fail))


def _log_skipped(skip_log: str, named, bad_gaps):
    """The op appending a batch's gaps to ``skip_log`` (nothing when it has none): one row per failed element the
    history names, (name, 1); the oldest of a longer run of failures also counts the unnamed ones before it.
    ``named``: each gap's TAG_HISTORY predecessors' names, oldest first."""
    import tensorflow as tf

    k = TAG_HISTORY
    column = tf.range(k, dtype=tf.int64)[None, :]
    dropped = column >= k - bad_gaps[:, None]
    counts = tf.where(column == 0, tf.maximum(bad_gaps[:, None] - k + 1, 1), 1)
    rows = tf.strings.join([tf.boolean_mask(named, dropped), tf.strings.as_string(tf.boolean_mask(counts, dropped))],
                           "\t")
    return tf.cond(tf.size(bad_gaps) > 0, lambda: tf.print(tf.strings.reduce_join(rows, separator="\n"),
                                                           output_stream="file://" + skip_log),
                   lambda: tf.no_op())


def raw_log(split) -> str:
    """Where the pipeline appends what it skips, a row each time it meets one (every pass, every pull): beside
    ``split.skip_log``, hidden; a temporary file when there is none. ``skipped`` makes ``skip_log`` from it."""
    if split.raw_log is None:
        if split.skip_log is not None:
            log_path = Path(split.skip_log)
            split.raw_log = str(log_path.with_name(f".{log_path.stem}.log"))
        else:
            fd, split.raw_log = tempfile.mkstemp(prefix="tftoolkit-skipped-", suffix=".log")
            os.close(fd)
    return split.raw_log


def skipped(split) -> tuple[int, list[str]]:
    """(how many, their names in the order met) of the examples --skip-bad-images skipped, each counted once
    however many epochs (and pulls) met it, and written to ``skip_log`` (when set), one row per example:
    its name, a tab, and how many were skipped ending with it (1; more where over TAG_HISTORY failed in a row
    and the first of them are not named). In memory: those file_source.read_stream left out; streamed: what the
    pipeline logged, with what ``skip_log`` already held (a resumed run's earlier processes)."""
    rows: list[str] = []
    for where in ([split.raw_log] if not split.in_memory_skips else []) + [split.skip_log]:
        if where and Path(where).exists():
            rows += Path(where).read_text().splitlines()
    gaps: dict[str, int] = {name: 1 for name in split.in_memory_skips}
    for line in rows:
        where, _, gap = line.rpartition("\t")
        where = where.strip().strip('"')
        if where:
            gaps[where] = max(gaps.get(where, 0), int(gap) if gap.isdigit() else 1)
    if split.skip_log is not None and (gaps or Path(split.skip_log).exists()):
        atomic_write(Path(split.skip_log), "".join(f"{name}\t{n}\n" for name, n in gaps.items()))
    return sum(gaps.values()), list(gaps)


def missing(split, ids) -> list[tuple[int, int]]:
    """(unit, record) of every example whose id is not in ``ids`` (those StreamSplit.decoded left out)."""
    gone = np.setdiff1d(np.arange(split.n, dtype=np.int64), np.asarray(ids, np.int64))
    if split.counts is None:
        return [(int(i), 0) for i in gone]
    units = np.searchsorted(split.offsets, gone, side="right") - 1
    return [(int(u), int(i - split.offsets[u])) for u, i in zip(units, gone)]


def explain(split, unit: int, rec: int) -> str:
    """Why example (unit, rec) of ``split`` cannot be used: its record or file read again, alone, eagerly."""
    import tensorflow as tf

    try:
        if split.counts is None:
            data = tf.constant(split.units[unit])
        else:
            data = next(iter(tf.data.TFRecordDataset(split.units[unit]).skip(rec).take(1)), None)
            if data is None:
                return f"it has no {split.what} {rec}"
        fit_fn(split)(tf.constant(unit, tf.int64), tf.constant(rec, tf.int64), data)
        return "it decodes when read alone (a read error at the time?)"
    except tf.errors.OpError as e:
        # An eager Assert puts its data (the mark, the label) on the lines after its first.
        full = " ".join(line.strip() for line in e.message.splitlines())
        if MARK in full and "label out of range" in full:
            value = re.findall(r"-?\d+", full.split("label out of range", 1)[1])
            stored = f"{value[0]} " if value else ""
            shift = f", less {split.label_offset}" if split.label_offset else ""
            return f"its label {stored}is out of range (0..{split.num_classes - 1}{shift})"
        if MARK in full and JPEG_CUT_SHORT in full:
            return "it is a JPEG cut short (its data ends before its end-of-image marker: a partial copy or download?)"
        if MARK in full and JPEG_BROKEN in full:
            return "it is a damaged JPEG (its headers break off before the image data)"
        return first_line(e).rstrip(".")
    except Exception as e:  # noqa: BLE001 - a reason, whatever it is
        return f"{type(e).__name__}: {e}"


def explain_error(error: BaseException, splits) -> str | None:
    """The error a bad example raised while streaming (``MARK``), as one line naming its file (and record) and
    why; None for any other error."""
    text = str(error)
    if MARK not in text:
        return None
    m = re.search(re.escape(MARK) + r"\]?\s*\[?does not parse or decode\]?\s*\[(.+?)\]\s*\[?(\d+)", text, re.S)
    if not m:
        return "a bad example stopped the run: " + text.split(MARK, 1)[1].splitlines()[0].strip(" ,[]")
    where, gap = m.group(1).strip(" '\""), int(m.group(2))
    reason = "it does not parse or decode"
    for split in splits:
        found = split.locate(where)
        if found is not None:
            reason = explain(split, *found)
            break
    more = f" (and {gap - 1} just before it)" if gap > 1 else ""
    return (f"cannot use {where}{more}: {reason}; --skip-bad-images skips such images, counts them and names them "
            "in summary.json")
