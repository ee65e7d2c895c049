"""TensorFlow's one door: ``import_tensorflow`` imports it the first time with its start-up lines held back and the
objects the import makes kept out of the garbage collector (``frozen_import``), and returns the module.

Below every layer that uses TensorFlow (data writes shards with it, engine trains with it), so that whichever of them
a process reaches first goes through the same door; it imports nothing of the toolkit. engine.devices sets up the
devices through it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile


# What TensorFlow's C++ side prints while it loads and first looks for GPUs, before absl logging is initialised:
# absl writes those lines to stderr whatever TF_CPP_MIN_LOG_LEVEL says (it is read only after), so every notebook's
# first cell showed them ("oneDNN custom operations are on", "Could not find cuda drivers", and on a machine without
# a GPU "failed call to cuInit ... (303)"; TensorFlow 2.16-2.17 also "Unable to register cuDNN factory").
STARTUP_NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
                           r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"
                           r"|E\d{4} .*failed call to cuInit"
                           r"|\S+ \S+: [IWE] \S+\] "
                           r"(Unable to register cu\w+ factory|.*cuInit|oneDNN custom operations))")


def startup_noise(line: str) -> bool:
    """Whether ``line`` is one of TensorFlow's start-up lines that TF_CPP_MIN_LOG_LEVEL >= 2 means to hide."""
    return bool(STARTUP_NOISE.match(line))


@contextlib.contextmanager
def holding_stderr(drop):
    """Hold file descriptor 2 (where TensorFlow's C++ side writes, out of Python's reach) while the block runs, then
    write back every held line for which ``drop(line)`` is false. The one place the toolkit holds stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if line.strip() and not drop(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def import_tensorflow():
    """The ``tensorflow`` module, imported the first time with its start-up lines held back where
    TF_CPP_MIN_LOG_LEVEL is 2 or more (tftoolkit/__init__.py's default; a user who sets 0 or 1 sees them all):
    ``holding_stderr`` for that time, every other line written back; it looks for GPUs then (where cuInit runs).
    The objects the import makes are kept out of the garbage collector (``frozen_import``)."""
    if "tensorflow" not in sys.modules:
        quiet = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0").strip() in ("2", "3")
        with frozen_import(), holding_stderr(startup_noise) if quiet else contextlib.nullcontext():
            import tensorflow as tf  # deferred: importing tftoolkit must not import TensorFlow

            tf.config.list_physical_devices("GPU")
    import tensorflow as tf

    return tf


@contextlib.contextmanager
def frozen_import():
    """Run an import with Python's cyclic garbage collector off; if it succeeds, move every object alive into the
    collector's permanent generation (``gc.freeze``). The collector is turned back on as it was either way.

    Importing TensorFlow (and the Keras it imports) makes about 570,000 tracked objects that live as long as the
    process: modules, classes, functions, op registrations. Each full collection walks all of them, during the import,
    in every later full collection of a training's tracing, and in the collections at interpreter exit; frozen, no
    collection looks at them again. 2026-12-07, 2-core VM: a process that imports TensorFlow and exits took 0.577x
    the CPU (medians 2.21 / 3.82 s), a short ``tftoolkit train`` 0.876x (benchmarks/bench_gc_freeze.py,
    docs/benchmarks/gc-freeze.md).

    The cost: a frozen object that later becomes unreachable inside a reference cycle is never freed. One collection
    runs first, so the dead cycles already on the heap (a notebook's earlier cells, a test session's earlier tests)
    are freed rather than frozen; the import's own dead cycles are frozen with it (3,848 objects, about 1.8 MB, in a
    fresh process), cheaper than a second full collection (about 0.3 s). The switch is process-wide: another thread
    that turns the collector off during the import has it turned back on at the end."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()
