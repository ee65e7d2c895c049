"""Would this graph stay on a GPU? TensorFlow's kernel registry answers it on any machine, GPU or not.

TensorFlow registers, per op, device and dtype, which kernel runs and which of its arguments live in host memory
(``tensorflow.python.framework.kernels.get_registered_kernels_for_op``; the pip build registers its GPU kernels
even where no GPU is present). Two things send data back to the host on a GPU:
- no GPU kernel for the op's dtypes (GatherV2 on uint8, MirrorPad on uint8): the placer runs the op on the CPU
  and copies its inputs and outputs across;
- a GPU kernel that keeps an argument in host memory (anything int32: Identity, Reshape, AddV2 ...): the tensor
  is copied to the host for the op, and back for whatever reads it next.
Host-memory arguments that are constants of the graph (a shape, an axis, paddings) cost nothing and are fine.

``gpu_problems(graph)`` lists every op of a traced graph that breaks either rule. tests/engine/test_feed.py and
``tftoolkit doctor``'s placement check run it on the device-placement path (engine.feed).
"""

from __future__ import annotations

from functools import lru_cache

import tensorflow as tf
from tensorflow.python.framework import kernels  # the registered kernels: not in TensorFlow's public API

SKIP = {"Const", "Placeholder", "NoOp"}


@lru_cache(maxsize=None)
def _gpu_kernels(op_type: str) -> tuple:
    out = []
    for k in kernels.get_registered_kernels_for_op(op_type).kernel:
        if k.device_type != "GPU":
            continue
        cons = {c.name: frozenset(int(t) for t in c.allowed_values.list.type) for c in k.constraint}
        out.append((cons, frozenset(k.host_memory_arg)))
    return tuple(out)


def _attr(op, name):
    try:
        value = op.get_attr(name)
    except ValueError:
        return None
    return getattr(value, "as_datatype_enum", value)


def _arg_names(op, args) -> list[str]:
    """The argument name of each input (or output) tensor of ``op``, list arguments expanded."""
    names = []
    for arg in args:
        if arg.number_attr:
            n = int(op.get_attr(arg.number_attr))
        elif arg.type_list_attr:
            n = len(op.get_attr(arg.type_list_attr))
        else:
            n = 1
        names.extend([arg.name] * n)
    return names


def _constant(tensor) -> bool:
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return op.type == "Const"


def gpu_problems(graph) -> list[str]:
    """One line per op of ``graph`` that would run on the CPU, or move a computed tensor through host memory,
    on a GPU."""
    problems = []
    for op in graph.get_operations():
        if op.type in SKIP:
            continue
        kernels = _gpu_kernels(op.type)
        match = None
        for cons, host in kernels:
            if all(_attr(op, name) in allowed for name, allowed in cons.items()):
                match = host
                break
        if match is None:
            types = {name: tf.as_dtype(_attr(op, name)).name for cons, _ in kernels[:1] for name in cons
                     if _attr(op, name) is not None}
            problems.append(f"{op.type} ({op.name}): no GPU kernel for "
                            f"{', '.join(f'{k}={v}' for k, v in types.items()) or 'these types'}: it runs on the CPU")
            continue
        if not match:
            continue
        for tensor, arg in zip(op.inputs, _arg_names(op, op.op_def.input_arg)):
            if arg in match and not _constant(tensor):
                problems.append(f"{op.type} ({op.name}): input {arg!r} ({tensor.dtype.name}) is kept in host memory")
        if all(_constant(t) for t in op.inputs):
            continue  # computed from constants only: folded before it runs
        for tensor, arg in zip(op.outputs, _arg_names(op, op.op_def.output_arg)):
            if arg in match:
                problems.append(f"{op.type} ({op.name}): output {arg!r} ({tensor.dtype.name}) is kept in host memory")
    return problems
