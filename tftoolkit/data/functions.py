"""Python functions handed to tf.data, traced as written.

tf.data converts every function it is given with autograph (tens of ms each, paid again by every process), and
no function of the toolkit's input paths branches on a tensor in Python. ``plain`` marks one not to convert; the
functions it calls, and the datasets it builds, inherit that.
"""


def plain(fn):
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(fn)
