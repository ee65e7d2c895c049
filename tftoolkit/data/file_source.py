"""A DataSource over files (data/stream.py's StreamSplits: image folders, ImageNet-layout or TFDS shards, a
manifest set): decoded into memory once when both splits fit the memory budget (--data-memory-gb, default a quarter
of the RAM available), else streamed from the files while training. Either way the same reader decodes them, so a
split decodes to the same pixels in memory and streamed.
"""

from __future__ import annotations

import logging
import time

import psutil

from ..errors import DataError
from ..fileio import size_text
from . import bad_records, store as store_mod, stream
from .source import SHOW_SKIPPED, DataSource

# TensorFlow is imported inside the functions that build datasets: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

log = logging.getLogger("tftoolkit")


def memory_budget(gb: float | None) -> int:
    """Bytes of decoded pixels a dataset may take in memory: ``gb``, or a quarter of the RAM available now."""
    if gb:
        return int(gb * 1e9)
    try:
        return int(psutil.virtual_memory().available // 4)
    except Exception:  # noqa: BLE001
        return 4 * 10**9


def from_streams(name: str, train, val=None, class_names=None, info: dict | None = None,
                 memory_gb: float | None = None, limit: int | None = None) -> DataSource:
    """A source over stream.StreamSplits: decoded into memory now when both splits fit ``memory_gb`` (default: a
    quarter of the RAM available), else streamed from their files while training (data/stream.py). ``limit``: the
    first that many training examples only (--train-images), taken before anything is decoded."""
    if limit is not None:
        if limit > train.n:
            raise DataError(f"--train-images {limit}: {name} has {train.n} training images; give at most {train.n}, "
                            "or leave it out to use them all")
        train = train.head(limit)
    info = dict(info or {})
    budget = memory_budget(memory_gb)
    need = train.nbytes + (val.nbytes if val is not None else 0)
    streamed = need > budget
    info.update({"input_source": "stream" if streamed else "memory", "streamed": streamed, "decoded_bytes": int(need),
                 "memory_budget_bytes": int(budget), "transform": train.mode,
                 "input_threads": dict(train.threads)})
    streams = {"train": train, **({"val": val} if val is not None else {})}
    source = DataSource(name, None, None, train.n, val.n if val is not None else 0, train.shape, train.num_classes,
                        list(class_names or [str(i) for i in range(train.num_classes)]), info, streams=streams,
                        streamed=streamed)
    if streamed:
        log.info("%s: %d images = %s decoded at %dx%d, over the memory budget of %s: streaming them from "
                 "their files (%d decode threads)", name, train.n + (val.n if val is not None else 0), size_text(need),
                 train.size, train.size, size_text(budget), train.threads["decode_threads"])
        source.train = stream.as_examples(train)
        source.val = stream.as_examples(val, evaluate=True) if val is not None else None
        return source
    skipped = []
    for split, s in streams.items():
        t0 = time.perf_counter()
        store, lost = read_stream(s, evaluate=split == "val")
        info[f"{split}_read_s"] = round(time.perf_counter() - t0, 3)
        source.stores[split] = store
        s.in_memory_skips = lost  # what a run lists in skipped-<split>.tsv (StreamSplit.skipped)
        skipped += lost
    if skipped:
        info["skipped_images"] = len(skipped)
        info["skipped_image_examples"] = skipped[:SHOW_SKIPPED]
        log.warning("skipped %d image(s) that do not decode (--skip-bad-images): %s%s", len(skipped),
                    ", ".join(skipped[:SHOW_SKIPPED]), ", ..." if len(skipped) > SHOW_SKIPPED else "")
    source.train_examples = source.stores["train"].n
    if source.train_examples == 0:
        raise DataError(f"{name}: none of its {train.n} training images decodes")
    source.train = store_examples(source.stores["train"])
    if "val" in source.stores:
        source.val_examples = source.stores["val"].n
        source.val = store_examples(source.stores["val"])
    return source


def read_stream(split, evaluate: bool = False) -> tuple:
    """(store.Store of every example of a StreamSplit decoded (whole, or as evaluated: ``StreamSplit.decoded``),
    [names of those skipped]); an example that does not decode is a DataError naming it, unless the split skips
    bad examples."""
    store = store_mod.materialize(split.decoded(evaluate), split.n, split.shape)
    if store.n == split.n:
        return store, []
    missing = bad_records.missing(split, store.ids)
    if not split.skip_bad:
        first = missing[0]
        more = f" ({len(missing) - 1} more do not decode either)" if len(missing) > 1 else ""
        raise DataError(f"cannot use {split.where(*first)}: {bad_records.explain(split, *first)}{more}; "
                        "--skip-bad-images skips such images, counts them and names them in summary.json")
    return store, [split.where(*m) for m in missing]


def store_examples(st):
    """A store.Store as unbatched (image, label, id) examples."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((st.images, st.labels, st.ids))
