"""The task a run trains: its loss, one value per example, and the metrics it reports.

Default (no ``loss`` given, the model not compiled with one): image classification as the toolkit always did,
sparse categorical cross-entropy on logits, and accuracy. Otherwise ``loss`` is a Keras loss (an object, or a name
Keras knows: "mse", "binary_crossentropy", ...), or a callable ``(y_true, y_pred) -> per-example losses``, or, for a
model with several outputs, one of those per output (a dict by output name, or a list in output order). A model
its builder compiled (``model.compile(loss=..., metrics=...)``) brings its loss and metrics when ``loss`` is not
given; the toolkit's optimizer, LR schedule and loop still train it.

The rule that keeps N replicas equal to one device (engine/step.py sums a replica's per-example losses and divides
by the global batch) needs one value per example:
- A Keras loss object is called unreduced (``Loss.call``), whatever its ``reduction``: its per-example values.
- A loss that gives several values per example (per pixel of a mask, per token) is averaged over them first.
  For examples of one shape that is Keras' own "sum_over_batch_size" reduction (the mean over every element of
  the batch), so the toolkit's loss equals ``model.fit``'s on the same batch.
- A callable that gives one value for the whole batch (a mean inside it, a Keras loss with a reduction called
  through ``__call__``) hides the per-example values: it is refused before training (``check``), with the reason.
- Several outputs: each output's per-example loss, summed (Keras sums compiled losses with weights 1).

Metrics are Keras metrics (objects or names), created in the strategy's scope and updated on every replica's
share of each validation batch (Keras' own cross-replica sums); summary.json and evals.csv carry each as
``val_<name>``. "accuracy" is read as Keras' compile reads it: sparse categorical accuracy after a sparse
cross-entropy, binary accuracy after a binary one, categorical accuracy after a categorical one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError, first_line

DEFAULT_LOSS = "sparse_categorical_crossentropy (from logits)"


@dataclass
class Task:
    loss: Any                  # the loss as given (a name, object, callable, or a dict/list of them), or None
    per_example: Any           # (y_true, y_pred) -> float32 [batch]: one loss per example
    classification: bool       # the default task: accuracy from the argmax of the logits
    loss_name: str
    metrics: list = field(default_factory=list)   # keras.metrics.Metric objects, made in the strategy's scope
    metric_outputs: list = field(default_factory=list)  # per metric: the output it reads (None: the only one)

    @property
    def metric_names(self) -> list[str]:
        return [m.name for m in self.metrics]


def _name(loss) -> str:
    if isinstance(loss, str):
        return loss
    if isinstance(loss, dict):
        return "{" + ", ".join(f"{k}: {_name(v)}" for k, v in loss.items()) + "}"
    if isinstance(loss, (list, tuple)):
        return "[" + ", ".join(_name(v) for v in loss) + "]"
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def _one(loss):
    """A single output's loss spec -> fn(y_true, y_pred) giving its unreduced values."""
    import keras  # deferred: the task names and checks import without TensorFlow

    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except (ValueError, TypeError):
            raise ConfigError(f"unknown loss {loss!r}: Keras knows names such as mse, mae, binary_crossentropy, "
                              "categorical_crossentropy, sparse_categorical_crossentropy, huber; or pass a "
                              "keras.losses.Loss or a function (y_true, y_pred) -> per-example losses") from None
    if isinstance(loss, keras.losses.Loss):
        return loss.call  # unreduced, whatever the object's reduction
    if not callable(loss):
        raise ConfigError(f"loss {loss!r} is neither a Keras loss nor a callable (y_true, y_pred) -> losses")
    return loss


def _per_example(values):
    """A loss's values -> one float32 per example: the mean over every axis after the batch (see the module)."""
    import tensorflow as tf  # deferred: the task names and checks import without TensorFlow

    values = tf.cast(tf.convert_to_tensor(values), tf.float32)
    if values.shape.rank == 0:
        raise ConfigError("the loss gave one value for the whole batch, which hides the per-example values the "
                          "replicas' sums need (the global batch divides them): return one value per example (no "
                          "mean inside the function; a keras.losses.Loss object is called unreduced)")
    if values.shape.rank > 1:
        values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values


def _structured(loss, outputs):
    """fn(y_true, y_pred) -> per-example loss for ``loss`` over the model's outputs (``outputs``: their names,
    or None for a single output)."""
    import tensorflow as tf  # deferred: the task names and checks import without TensorFlow

    def cast(y):
        return tf.cast(y, tf.float32) if y.dtype.is_floating else y

    if isinstance(loss, dict) or (isinstance(loss, (list, tuple)) and outputs and len(outputs) > 1):
        names = list(outputs or [])
        specs = loss if isinstance(loss, dict) else dict(zip(names, loss))
        if isinstance(loss, (list, tuple)) and len(loss) != len(names):
            raise ConfigError(f"{len(loss)} losses for {len(names)} outputs ({', '.join(names)}): give one per output")
        unknown = sorted(set(specs) - set(names)) if names else []
        if unknown:
            raise ConfigError(f"loss for output(s) {', '.join(unknown)}, but the model's outputs are "
                              f"{', '.join(names) or 'one unnamed output'}")
        fns = {k: _one(v) for k, v in specs.items()}

        def per_example(y_true, y_pred):
            total = None
            for k, fn in fns.items():
                i = names.index(k)
                yt = y_true[k] if isinstance(y_true, dict) else y_true[i]
                yp = y_pred[k] if isinstance(y_pred, dict) else y_pred[i]
                v = _per_example(fn(yt, cast(yp)))
                total = v if total is None else total + v
            return total

        return per_example
    fn = _one(loss)
    return lambda y_true, y_pred: _per_example(fn(y_true, cast(y_pred)))


def _accuracy_for(loss_name: str):
    import keras  # deferred: the task names and checks import without TensorFlow

    name = loss_name.lower()
    if "sparse" in name:
        return keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    if "binary" in name:
        return keras.metrics.BinaryAccuracy(name="accuracy")
    if "categorical" in name:
        return keras.metrics.CategoricalAccuracy(name="accuracy")
    return keras.metrics.Accuracy(name="accuracy")


def _metric(spec, loss_name: str):
    import keras  # deferred: the task names and checks import without TensorFlow

    if isinstance(spec, keras.metrics.Metric):
        # Made again here, in the strategy's scope: a metric made outside it keeps plain variables, which the
        # replicas would not sum. One that cannot be remade from its config (a custom function) is used as it is.
        try:
            return type(spec).from_config(spec.get_config())
        except Exception:  # noqa: BLE001
            return spec
    if isinstance(spec, str):
        if spec in ("accuracy", "acc"):
            return _accuracy_for(loss_name)
        try:
            got = keras.metrics.get(spec)
        except (ValueError, TypeError):
            raise ConfigError(f"unknown metric {spec!r}: give a Keras metric name (mae, mse, auc, precision, "
                              "accuracy, ...) or a keras.metrics.Metric") from None
        if not isinstance(got, keras.metrics.Metric):
            return keras.metrics.MeanMetricWrapper(got, name=spec)
        try:  # named as asked ("mae", not "mean_absolute_error"): summary.json's field is val_<what was asked>
            return type(got)(name=spec)
        except TypeError:
            return got
    if callable(spec):
        return keras.metrics.MeanMetricWrapper(spec, name=getattr(spec, "__name__", "metric"))
    raise ConfigError(f"metric {spec!r} is neither a Keras metric nor a name Keras knows")


def names_of(text: str | None) -> list[str]:
    """A comma-separated --metrics value as names."""
    return [m.strip() for m in (text or "").split(",") if m.strip()]


def resolve(model, loss=None, metrics=None) -> Task:
    """The task for ``model`` (call inside the strategy's scope: metrics make variables there): ``loss`` and
    ``metrics`` as given, else what the model was compiled with, else the default classification task."""
    import keras  # deferred: the task names and checks import without TensorFlow
    import tensorflow as tf  # deferred: the task names and checks import without TensorFlow

    compiled = getattr(model, "_compile_loss", None) is not None  # Keras 3 keeps compile()'s arguments here
    if loss is None and compiled:
        loss = model.loss
    if metrics is None and getattr(model, "_compile_metrics", None) is not None:
        metrics = model._compile_metrics._user_metrics  # noqa: SLF001 - compile()'s metrics, as given
    outputs = list(model.output_names) if len(model.outputs) > 1 else None
    if loss is None:
        sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        task = Task(None, lambda y, logits: _per_example(sce.call(y, tf.cast(logits, tf.float32))), True,
                    DEFAULT_LOSS)
    else:
        task = Task(loss, _structured(loss, outputs), False, _name(loss))
    specs = metrics or []
    if isinstance(specs, dict):
        pairs = [(k, s) for k, v in specs.items() for s in (v if isinstance(v, (list, tuple)) else [v])]
    else:
        pairs = [(None, s) for s in (specs if isinstance(specs, (list, tuple)) else [specs])]
    for out, spec in pairs:
        if task.classification and spec in ("accuracy", "acc"):
            continue  # the default task reports accuracy already
        task.metrics.append(_metric(spec, task.loss_name if not isinstance(loss, dict) else _name(loss.get(out, ""))))
        task.metric_outputs.append(out)
    seen = set()
    for m in task.metrics:
        if m.name in seen or m.name in ("loss", "accuracy") and task.classification:
            raise ConfigError(f"two metrics are named {m.name!r}: give them distinct names (name=...)")
        seen.add(m.name)
    return task


def check(task: Task, model, x, y) -> None:
    """The loss and the metrics on a few examples, before training: a loss or metric that does not fit the
    model's outputs, targets of another shape, or a loss without per-example values is a one-line ConfigError
    naming what did not fit (Keras' own message, shortened), not a failure inside the first step."""
    import tensorflow as tf  # deferred: the task names and checks import without TensorFlow

    pred = model(x, training=False)
    n = int(tf.nest.flatten(y)[0].shape[0])
    _check_shapes(task, model, y, pred)
    try:
        values = task.per_example(y, pred)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - Keras' and TensorFlow's errors, named
        raise ConfigError(f"loss {task.loss_name} does not fit the model's outputs {_shapes(pred)} and the targets "
                          f"{_shapes(y)}: {first_line(e)}") from None
    if values.shape.rank != 1 or int(values.shape[0]) != n:
        raise ConfigError(f"loss {task.loss_name} gave values of shape {tuple(values.shape)} for {n} examples; it "
                          "must give one per example")
    for m, out in zip(task.metrics, task.metric_outputs):
        try:
            m.update_state(*pick(y, pred, out, model))
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"metric {m.name} does not fit the model's outputs {_shapes(pred)} and the targets "
                              f"{_shapes(y)}: {first_line(e)}") from None
        m.reset_state()


def _fits(target: tuple, output: tuple) -> bool:
    """Whether targets of per-example shape ``target`` go with outputs of ``output`` as a Keras loss reads them:
    the same shape, class indices for the last axis (sparse), or a scalar for one output unit. Anything else Keras
    would broadcast without a word (three targets against one output: a mean over a 3 x 1 grid)."""
    return target in (output, output[:-1])


def _check_shapes(task: Task, model, y, pred) -> None:
    import tensorflow as tf  # deferred: the task names and checks import without TensorFlow

    if task.classification:
        return
    if isinstance(pred, dict) or (isinstance(pred, (list, tuple)) and len(model.outputs) > 1):
        names = list(model.output_names)
        pairs = [(k, y[k] if isinstance(y, dict) else y[i], pred[k] if isinstance(pred, dict) else pred[i])
                 for i, k in enumerate(names) if (k in y if isinstance(y, dict) else i < len(y))]
    else:
        pairs = [("", y, pred)]
    for name, yt, yp in pairs:
        target, output = tuple(tf.convert_to_tensor(yt).shape[1:]), tuple(yp.shape[1:])
        if not _fits(target, output):
            where = f" of output {name}" if name else ""
            raise ConfigError(f"loss {task.loss_name} does not fit the model's outputs {_shapes(pred)} and the targets "
                              f"{_shapes(y)}: targets{where} of shape {target} per example against outputs of shape "
                              f"{output}; give targets of the outputs' shape (or class indices for their last axis)")


def pick(y, pred, out, model):
    """(y_true, y_pred) a metric reads: output ``out`` of several (by name), or the only one."""
    if out is None:
        return y, pred
    i = list(model.output_names).index(out)
    return (y[out] if isinstance(y, dict) else y[i]), (pred[out] if isinstance(pred, dict) else pred[i])


def _shapes(t) -> str:
    import tensorflow as tf  # deferred: the task names and checks import without TensorFlow

    shapes = tf.nest.map_structure(lambda v: tuple(v.shape), t)
    return str(shapes)


def check_class_labels(source) -> None:
    """The default loss (classification) on another task's data: its targets must be class indices, one per
    example, or the cross-entropy would read floats or vectors as classes without a word."""
    labels = source.store("train").labels
    if isinstance(labels, (dict, list, tuple)) or labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        what = "several arrays" if isinstance(labels, (dict, list, tuple)) else f"{labels.dtype} {labels.shape[1:]}"
        raise DataError(f"labels must be integers (class indices, one per example) for the default classification "
                        f"loss, got {what} per example; for other targets give the loss that fits them (loss='mse', "
                        "a keras.losses object, or --loss)")
