"""Python functions handed to tf.data, traced as written.

tf.data converts every function it is given with autograph (tens of ms each, paid again by every process), and
no function of the toolkit's input paths branches on a tensor in Python. ``plain`` marks one not to convert; the
functions it calls, and the datasets it builds, inherit that.
"""

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).


def plain(fn):
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(fn)
