"""Helpers several test modules share (tests/ is on sys.path: pytest puts the rootdir conftest's folder there)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The small, fast recipe behavioural tests train with (a test about counts, files or resuming does not need the
# default model, which is several times heavier): small_cnn, no warmup, a constant LR.
FAST = dict(model="small_cnn", warmup_epochs=0.0, schedule="constant")
FAST_ARGS = ["--model", "small_cnn", "--warmup-epochs", "0", "--schedule", "constant"]


def env_with_tests_on_path(**extra) -> dict:
    """os.environ for a subprocess that must import this folder's modules (``--model models_for_tests:...``)."""
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def assert_no_tensorflow(code: str, *args: str, timeout: float = 180) -> str:
    """Run ``code`` in a fresh interpreter and fail if it imported TensorFlow (or failed); returns its stdout."""
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import sys as _sys
        _loaded = sorted(m for m in _sys.modules if m == "tensorflow" or m.startswith(("tensorflow.", "keras")))
        assert not _loaded, f"TensorFlow imported: {_loaded[:5]}"
    """)
    done = subprocess.run([sys.executable, "-c", probe, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def checkpoint_variables(run_dir: Path, checkpoint: str | None = None) -> dict:
    """Every variable of a run's newest checkpoint (or of ``checkpoint``, a path prefix), by name."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(checkpoint or Path(run_dir) / "checkpoints"))
    # Keras 3 stores each weight once, under the optimizer's _trainable_variables (the model's path points to
    # the same objects); optimizer slots, the step and the example counters come too.
    skip = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if n not in skip}


def checkpointed_step(run_dir: Path) -> int:
    """The step of a run's newest checkpoint (0 when it has none)."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(Path(run_dir) / "checkpoints"))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def load_dataset(dataset, **config):
    """``catalog.load`` of a dataset (a path or a name) with ``config``'s other RunConfig fields."""
    from tftoolkit import RunConfig
    from tftoolkit.data import catalog

    return catalog.load(RunConfig(dataset=str(dataset), **config))


def examples(ds):
    """A source's split (unbatched (image, label, id)) as three NumPy arrays, in the dataset's order."""
    import numpy as np

    xs, ys, ids = [], [], []
    for x, y, i in ds.batch(1000).as_numpy_iterator():
        xs.append(x), ys.append(y), ids.append(i)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)
