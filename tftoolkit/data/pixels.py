"""Per-example pixel transforms shared by the in-memory pipeline (pipeline.py), the device feed (engine/feed.py)
and the streamed splits (stream.py): the uint8 -> float conversion and the augmentation keyed by (seed, epoch,
index), the same on any device and in any process."""

from __future__ import annotations

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).


def to_float(image):
    """uint8 pixels to [0, 1] floats, other floats to float32; integer inputs (token ids, indices) kept as they
    are. ``image`` may be a structure of inputs (a dict or tuple for a model with several)."""
    import tensorflow as tf

    def one(t):
        if t.dtype == tf.uint8:
            return tf.cast(t, tf.float32) / 255.0
        return tf.cast(t, tf.float32) if t.dtype.is_floating else t

    return tf.nest.map_structure(one, image)


_GOLDEN = -7046029254386353131       # 0x9E3779B97F4A7C15 as int64
_MIX1, _MIX2 = -4658895280553007687, -7723592293110705685  # splitmix64's multipliers as int64


def _mix(x):
    """splitmix64's finaliser on int64 (logical shifts, wrapping multiplies): a well-spread hash of x."""
    import tensorflow as tf

    def shr(v, k):  # logical right shift of a signed int64
        return tf.bitwise.bitwise_and(tf.bitwise.right_shift(v, k), tf.constant((1 << (64 - k)) - 1, tf.int64))

    x = x + _GOLDEN
    x = tf.bitwise.bitwise_xor(x, shr(x, 30)) * _MIX1
    x = tf.bitwise.bitwise_xor(x, shr(x, 27)) * _MIX2
    return tf.bitwise.bitwise_xor(x, shr(x, 31))


def augment_keys(indices, epoch, seed: int):
    """One int64 key per example: a hash of (seed, epoch, index into the split)."""
    import tensorflow as tf

    base = _mix(tf.cast(epoch, tf.int64) + tf.constant(seed, tf.int64) * 1_000_003)
    return _mix(base + tf.cast(indices, tf.int64))


def augment(images, keys, pad: int = 4):
    """Random horizontal flip and ``pad``-pixel reflect-pad-and-crop of a batch, one draw per example's key.

    Pure indexing (one pad and two batched gathers), so it runs on uint8 (the host pipeline) or float (the
    device: MirrorPad has GPU kernels for float types only) and gives the same pixels wherever it runs: what
    makes host and device placement train identically. The indices are int64 throughout: int32 arithmetic on a
    GPU runs in host memory (its kernels are registered that way), which would cost a round trip per step.
    """
    import tensorflow as tf

    h, w = images.shape[1], images.shape[2]
    flip = tf.equal(tf.bitwise.bitwise_and(keys, 1), 1)
    span = tf.constant(2 * pad + 1, tf.int64)
    dy = tf.math.floormod(tf.bitwise.right_shift(keys, 8), span)
    dx = tf.math.floormod(tf.bitwise.right_shift(keys, 24), span)
    padded = tf.pad(images, tf.constant([[0, 0], [pad, pad], [pad, pad], [0, 0]], tf.int64), mode="REFLECT")
    rows = dy[:, None] + tf.range(h, dtype=tf.int64)[None, :]
    cols = tf.where(flip[:, None], tf.range(w - 1, -1, -1, dtype=tf.int64)[None, :],
                    tf.range(w, dtype=tf.int64)[None, :]) + dx[:, None]
    out = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(out, cols, axis=2, batch_dims=1)
