"""``tftoolkit bench allreduce``: every implementation in every dtype over a size sweep and models' gradient sets,
as the tidy table written to ``allreduce.csv`` (its columns, definitions and timing: ``measure.allreduce``, this package)."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ... import fileio
from ...config import DTYPE_BYTES
from ...engine import devices
from ...errors import ConfigError
from ...logs import ensure_logging
from . import (COLUMNS, DEFAULT_MODELS, EXTRA_REPEATS, FLOAT32_BYTES, MAX_CHAIN, algbw_gbps, availability, busbw_gbps,
               chain_length, check_sum, make_strategy, model_gradient_set, parse_dtypes, parse_impls, parse_size,
               parse_sizes, time_allreduce)

log = logging.getLogger("tftoolkit")


def _row(impl, detail, replicas, dtype, payload, tensors, size, **kw) -> dict:
    row = {"impl": impl, "detail": detail, "replicas": replicas, "dtype": dtype, "payload": payload, "tensors": tensors,
           "size_bytes": size, "iters": None, "repeats": None, "time_s": math.nan, "time_min_s": math.nan,
           "time_err_s": math.nan, "time_raw_s": math.nan, "overhead_s": math.nan,
           "algbw_GBps": math.nan, "busbw_GBps": math.nan, "status": "ok", "reason": ""}
    row.update(kw)
    return row


def bench(replicas: int, sizes="4KiB..256MiB", impls="all", *, repeats: int = 10, warmup: int = 2,
          models=DEFAULT_MODELS, image_size: int = 32, num_classes: int = 10, max_chain: int = MAX_CHAIN, out=None,
          quiet: bool = False, dtypes="float32"):
    """Time every implementation in every dtype over the size sweep and each model's gradient set; returns the tidy
    frame (and writes ``out/allreduce.csv`` plus ``out/bench.json`` with the parameters when ``out`` is given).
    The dtypes of one payload are timed one after the other, so a drifting machine disturbs their ratio least.

    ``max_chain`` caps the all-reduces chained in one timed call (CHAIN_BYTES). The chain is unrolled in the
    graph, so its tracing cost grows with it: smoke runs use a short one."""
    ensure_logging(quiet)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ConfigError(f"--replicas must be an integer >= 1, got {replicas!r}")
    size_list = parse_sizes(sizes) if isinstance(sizes, str) else sorted(set(parse_size(s) for s in sizes))
    impl_list = parse_impls(impls) if isinstance(impls, str) else parse_impls(",".join(impls))
    dtype_list = parse_dtypes(dtypes)
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    if not isinstance(max_chain, int) or isinstance(max_chain, bool) or max_chain < 1:
        raise ConfigError(f"--max-chain must be an integer >= 1, got {max_chain!r}")
    model_list = [m for m in (models.split(",") if isinstance(models, str) else (models or ())) if m and m != "none"]
    setup = devices.init(replicas)
    # (payload, shapes, their own dtypes, elements): each dtype moves elements x its bytes.
    payloads = [("buffer", [(s // FLOAT32_BYTES,)], ["float32"], s // FLOAT32_BYTES) for s in size_list]
    for m in model_list:
        shapes, dts = model_gradient_set(m, (image_size, image_size, 3), num_classes)
        payloads.append((f"grads:{m}", shapes, dts, sum(int(np.prod(s)) for s in shapes)))
    rows = []
    for impl in impl_list:
        ok, why = availability(impl, setup)
        if not ok:
            rows += [_row(impl, "", replicas, dt, "", None, None, status="skipped", reason=why) for dt in dtype_list]
            log.info("all-reduce %s: skipped (%s)", impl, why)
            continue
        try:
            strategy, options, detail = make_strategy(impl, setup)
        except Exception as e:  # noqa: BLE001 - an implementation that cannot be built here is a row, not a crash
            rows += [_row(impl, "", replicas, dt, "", None, None, status="failed", reason=_first_line(e))
                     for dt in dtype_list]
            continue
        checked = []
        for dt in dtype_list:
            try:
                right, why = check_sum(strategy, options, dtype=dt)
            except Exception as e:  # noqa: BLE001 - a dtype this implementation cannot all-reduce here: a row
                right, why = False, _first_line(e)
            if right:
                checked.append(dt)
            else:
                rows.append(_row(impl, detail, replicas, dt, "", None, None, status="failed", reason=why))
                log.warning("all-reduce %s in %s: %s; not timed", impl, dt, why)
        for payload, shapes, dts, elements in payloads:
            for dt in checked:
                rows.append(_timed_row(strategy, options, impl, detail, replicas, dt, payload, shapes, dts, elements,
                                       repeats=repeats, warmup=warmup, max_chain=max_chain))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for col in ("tensors", "size_bytes", "iters", "repeats"):
        frame[col] = frame[col].astype("Int64")  # integers, empty where skipped (not 4096.0)
    if out is not None:
        out = Path(out)
        fileio.write_csv(out / "allreduce.csv", frame)
        fileio.write_json(out / "bench.json", {
            "bench": "allreduce", "replicas": replicas, "device_kind": setup.kind, "devices": list(setup.devices),
            "host_cores": setup.host_cores, "sizes": size_list, "impls": impl_list, "dtypes": dtype_list,
            "repeats": repeats,
            "warmup": warmup, "max_chain": max_chain, "models": model_list, "image_size": image_size,
            "num_classes": num_classes,
            "threads": devices.thread_settings(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "definitions": ("algbw = size_bytes / time_s / 1e9; busbw = algbw * 2(n-1)/n (nccl-tests); size_bytes = "
                            "elements x the bytes of the row's dtype (what crosses the link); sizes name the float32 "
                            "buffer"),
            "timing": ("time_s = (a call of `iters` chained all-reduces, each cast to the row's dtype and back as the "
                       "training step does, - the same call without them, casts included) / iters, median "
                       "over interleaved repeats, devices synchronised at both ends of each call; time_err_s = its "
                       "standard error; status unresolved = time_s under 2 standard errors after up to "
                       f"{EXTRA_REPEATS}x the repeats (no bandwidth); time_raw_s = the first call / iters (overhead "
                       "included); overhead_s = the second call"),
            "sum_checked": True,
        })
    return frame


def _timed_row(strategy, options, impl, detail, replicas, dtype, payload, shapes, dts, elements, *, repeats, warmup,
               max_chain) -> dict:
    """One row: ``payload`` all-reduced in ``dtype``, timed; a bandwidth when resolved, the reason when not."""
    nbytes = elements * DTYPE_BYTES[dtype]
    # The chain follows the float32 size, so every dtype of one payload is timed in calls of the same shape.
    iters = chain_length(elements * FLOAT32_BYTES, max_chain)
    try:
        t = time_allreduce(strategy, shapes, dtypes=dts, options=options, repeats=repeats, warmup=warmup, iters=iters,
                           max_repeats=EXTRA_REPEATS * repeats, allreduce_dtype=dtype)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory at the largest size: record, go on
        log.warning("all-reduce %s %s %s (%d bytes) failed: %s", impl, dtype, payload, nbytes, _first_line(e))
        return _row(impl, detail, replicas, dtype, payload, len(shapes), nbytes, status="failed", reason=_first_line(e))
    row = _row(impl, detail, replicas, dtype, payload, len(shapes), nbytes, iters=t["iters"], repeats=t["repeats"],
               time_s=t["time_s"], time_min_s=t["time_min_s"], time_err_s=t["time_err_s"],
               time_raw_s=t["time_raw_s"], overhead_s=t["overhead_s"])
    if t["resolved"]:
        row.update(algbw_GBps=algbw_gbps(nbytes, t["time_s"]), busbw_GBps=busbw_gbps(nbytes, t["time_s"], replicas))
        log.info("all-reduce %-17s %-8s %-16s %12d B  %10.3f ms  busbw %7.3f GB/s", impl, dtype, payload, nbytes,
                 t["time_s"] * 1e3, row["busbw_GBps"])
    else:
        row.update(status="unresolved", reason=unresolved_reason(t))
        log.info("all-reduce %-17s %-8s %-16s %12d B  %s", impl, dtype, payload, nbytes, row["reason"])
    return row


def unresolved_reason(t: dict) -> str:
    return (f"within the call's noise: under {t['bound_s'] * 1e6:.3g} us per all-reduce ({t['iters']} chained, "
            f"{t['repeats']} repeats, call overhead {t['overhead_s'] * 1e3:.3g} ms); a longer --max-chain or more "
            f"--repeats resolve it")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
