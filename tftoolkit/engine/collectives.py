"""Sums across replicas inside a replica context, without TensorFlow's tracing cost.

``ReplicaContext.all_reduce`` wraps each call in a ``tf.custom_gradient`` (the gradient of an all-sum is an
all-sum), and in graph mode a custom gradient walks the graph back from its outputs to find the variables they
depend on. An all-reduced value depends on every replica's graph, not only on this replica's inputs, so the
walk runs through all of them: once per synchronized batch-norm layer in the forward pass and again, over the
growing backward graph, for each layer's gradient. Tracing resnet20's step took 16 s on 2 replicas against 3 s
on one. Feeding the all-reduce through ``tf.stop_gradient`` ends every walk at its own inputs; where a gradient
is needed (``all_sum``) it is given explicitly, as the same all-sum.
"""

from __future__ import annotations

from ..errors import ConfigError


def all_sum_no_gradient(values, options=None):
    """The SUM all-reduce of ``values`` (a tensor or a list of tensors), for values nothing differentiates
    (gradients, counts): the same result as ``ctx.all_reduce(SUM, values)``. ``options``: CommunicationOptions
    for this call (the all-reduce benchmark asks for RING so)."""
    import tensorflow as tf  # deferred: see the module's imports

    ctx = tf.distribute.get_replica_context()
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.nest.map_structure(tf.stop_gradient, values), options=options)


def all_sum(x):
    """The SUM all-reduce of tensor ``x``, differentiable: the gradient of an all-sum is the all-sum of the
    gradients (every replica's output depends on every replica's input)."""
    import tensorflow as tf  # deferred: see the module's imports

    @tf.custom_gradient
    def summed(value):
        return all_sum_no_gradient(value), all_sum_no_gradient
    return summed(x)


# --- the gradient all-reduce: its dtype and its packs ------------------------------------------------------


def gradient_sizes(variables) -> list[int]:
    """Elements of each variable's gradient (a sparse gradient counts as its dense size: what it can move)."""
    return [int(v.shape.num_elements()) for v in variables]


def travels_as(own, dtype: str):
    """The dtype a gradient of dtype ``own`` crosses the all-reduce in: ``own`` for float32 (no cast: float64
    gradients stay float64), else the 16-bit ``dtype`` for any wider float."""
    import tensorflow as tf  # deferred: see the module's imports

    own, target = tf.as_dtype(own), tf.as_dtype(dtype)
    return target if dtype != "float32" and own.is_floating and own.size > target.size else own


def gradient_bytes(variables, dtype: str = "float32") -> int:
    """Bytes one all-reduce of the gradients of ``variables`` moves per replica, each in ``travels_as``."""
    return sum(n * travels_as(v.dtype, dtype).size for n, v in zip(gradient_sizes(variables), variables))


def pack_plan(sizes: list[int], packs: int) -> list[list[int]]:
    """Indices of the gradients in each pack: ``packs`` runs of consecutive gradients of about equal size, in reverse
    order (the last layer's gradient first), so the first pack holds what the backward pass finishes first.

    TensorFlow's own ``NcclAllReduce(num_packs=K)`` / ``HierarchicalCopyAllReduce(num_packs=K)`` concatenate *all*
    gradients before cutting them into K (``_ConcatAndSplitPacker`` in cross_device_ops.py), so no pack can start
    before the last gradient exists: K chunks, no overlap with the backward pass. Each pack here is its own all-reduce
    call, depending only on its own gradients, which is what ``CommunicationOptions(bytes_per_pack)`` does inside
    CollectiveAllReduce (it too reverses the list first), for every implementation alike.
    """
    n = len(sizes)
    if not 1 <= packs <= n:
        raise ConfigError(f"--allreduce-packs {packs}: the model has {n} gradient tensors, so at most {n} packs "
                          f"(each pack holds at least one); use a number from 1 to {n}")
    order = list(range(n - 1, -1, -1))
    total = float(sum(sizes)) or 1.0
    plan, current, done = [], [], 0.0
    for pos, i in enumerate(order):
        current.append(i)
        done += sizes[i]
        left_tensors, left_packs = n - pos - 1, packs - len(plan) - 1
        # Close the pack at its share of the bytes, and always while the tensors left can still fill the packs left.
        if left_packs and (done >= total * (len(plan) + 1) / packs or left_tensors == left_packs):
            plan.append(current)
            current = []
    plan.append(current)
    return plan


def all_reduce_gradients(grads, dtype: str = "float32", plan: list[list[int]] | None = None, extra=None,
                         options=None):
    """The SUM all-reduce of a replica's gradients: cast to ``dtype``, one all-reduce call per pack of ``plan``
    (pack_plan; default one pack), cast back to each gradient's own dtype. ``extra`` (a tensor, e.g. the noise
    scale's float64 sums) rides in the last pack's call, uncast. Returns the reduced gradients (and ``extra``).
    ``options``: CommunicationOptions for every call (the benchmark's; a run's strategy carries its own).

    Mixed precision's loss scale sits before the cast: the gradients are cast while still multiplied by it (the loss
    was scaled before differentiation), so float16 keeps small gradients in range; LossScaleOptimizer.apply divides
    it out in float32 after the all-reduce, and skips a step whose sum overflowed to inf (lowering the scale).
    """
    import tensorflow as tf  # deferred: see the module's imports

    plan = plan if plan is not None else [list(range(len(grads)))[::-1]]

    def cast(g, to):
        if g is None or g.dtype == to:
            return g
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(tf.cast(g.values, to), g.indices, g.dense_shape)
        return tf.cast(g, to)

    out = list(grads)
    reduced_extra = None
    for p, pack in enumerate(plan):
        members = [i for i in pack if grads[i] is not None]
        values = [cast(grads[i], travels_as(grads[i].dtype, dtype)) for i in members]
        if extra is not None and p == len(plan) - 1:
            *values, reduced_extra = all_sum_no_gradient(values + [extra], options)
        elif values:
            values = all_sum_no_gradient(values, options)
        for i, v in zip(members, values):
            out[i] = cast(v, grads[i].dtype)
    return out if extra is None else (out, reduced_extra)
