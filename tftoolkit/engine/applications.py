"""The keras.applications networks usable as ``--model NAME``: which names, what each builds, and building one.

The registry of our own models, engine/models.py, builds these by name too.
"""

from __future__ import annotations

from ..errors import ModelError

# keras.applications models usable as --model NAME, always built from scratch (weights=None: no downloads), whole:
# with the classifier head keras.applications gives them (include_top=True), as published rows ran them (VGG16's
# three dense layers are 124M of its 138M parameters, and most of what its all-reduce moves). NAME_headless is the
# network without that head: global average pooling and one Dense layer (VGG16: 15.2M parameters).
HEADLESS = "_headless"
APPLICATIONS = {
    "resnet50": "ResNet50",
    "resnet101": "ResNet101",
    "resnet152": "ResNet152",
    "inceptionv3": "InceptionV3",
    "resnet50v2": "ResNet50V2",
    "mobilenet_v2": "MobileNetV2",
    "mobilenet_v3_small": "MobileNetV3Small",
    "efficientnet_b0": "EfficientNetB0",
    "densenet121": "DenseNet121",
    "vgg16": "VGG16",
}


def application(name) -> str | None:
    """The keras.applications class a registry name builds (``vgg16`` and ``vgg16_headless`` -> VGG16), or None."""
    return APPLICATIONS.get(name.removesuffix(HEADLESS)) if isinstance(name, str) else None


def describe(name) -> str:
    """What a keras.applications name builds, in words (empty for other models): with or without its classifier."""
    cls, whole = application(name), str(name).removesuffix(HEADLESS)
    if cls is None:
        return ""
    if name != whole:
        return (f"keras.applications {cls} without its classifier head (include_top=False): global average pooling "
                f"and one Dense layer; {whole} is the whole network")
    return (f"keras.applications {cls} whole, with its classifier head (include_top=True), as published rows ran "
            f"it; {name}{HEADLESS} is the network without that head")


def build_application(name, input_shape, num_classes):
    import keras  # deferred: the model registry imports without Keras

    cls, headless = getattr(keras.applications, application(name)), name.endswith(HEADLESS)
    try:
        # Batch norm in these models keeps per-replica statistics (Keras' default), so N replicas match
        # one device only approximately; resnet20 and small_cnn match exactly.
        if headless:
            base = cls(weights=None, include_top=False, input_shape=tuple(input_shape), pooling="avg")
        else:  # logits: the loss takes them (from_logits=True), so the head's softmax is left out
            base = cls(weights=None, include_top=True, input_shape=tuple(input_shape), classes=num_classes,
                       classifier_activation=None)
    except ValueError as e:  # e.g. input too small for the architecture
        raise ModelError(f"model {name} cannot take input shape {tuple(input_shape)}: {e}") from None
    # float32 logits under mixed precision too (the whole network's own head computes in the policy's dtype)
    outputs = (keras.layers.Dense(num_classes, dtype="float32") if headless
               else keras.layers.Activation("linear", dtype="float32"))(base.output)
    return keras.Model(base.input, outputs, name=name)
