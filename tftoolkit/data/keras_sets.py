"""The small standard sets by name, through ``keras.datasets``: cifar10, cifar100, mnist, fashion_mnist.

Keras downloads each once into its cache ($KERAS_HOME, else ~/.keras: ``datasets/``) and checks the archive's
hash. Offline, the error is one line naming the URL Keras asked for and the path it looks for it at (read from
Keras' own download call, so it stays right when Keras renames its files), and for CIFAR the alternative of giving
its python folder as a PATH (data/cifar.py). The test split is the validation split; images keep their size (28
for the MNISTs, one channel) unless --image-size asks for another.
"""

from __future__ import annotations


import numpy as np

from ..errors import DataError
from .source import from_arrays, resized

CLASS_NAMES = {
    "cifar10": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
    "cifar100": None,  # Keras gives no names for the 100 fine labels
    "mnist": [str(i) for i in range(10)],
    "fashion_mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"],
}
NAMES = tuple(CLASS_NAMES)


def _fetch(name: str):
    """keras.datasets.<name>.load_data(), with the file Keras could not download named."""
    import keras  # deferred: Keras starts TensorFlow, which ``import tftoolkit`` must not (tftoolkit/__init__.py)
    from keras.src.utils import file_utils

    asked: list[tuple[str, str]] = []
    real = getattr(file_utils, "urlretrieve", None)

    def recording(url, filename, *args, **kwargs):
        asked.append((url, filename))
        return real(url, filename, *args, **kwargs)

    if real is not None:
        file_utils.urlretrieve = recording
    try:
        return getattr(keras.datasets, name).load_data()
    except Exception as e:  # noqa: BLE001 - Keras raises a bare Exception for a failed download
        if not asked or "URL fetch failure" not in str(e) and not isinstance(e, OSError):
            raise
        url, target = asked[-1]
        alt = {"cifar10": " (or download cifar-10-python.tar.gz, unpack it and give --dataset PATH/cifar-10-batches-py)",
               "cifar100": " (or download cifar-100-python.tar.gz, unpack it and give --dataset PATH/cifar-100-python)"}
        raise DataError(f"{name}: Keras could not download {url} ({_reason(e)}); put that file at {target} (Keras' "
                        f"cache: $KERAS_HOME, else ~/.keras) and run again{alt.get(name, '')}") from None
    finally:
        if real is not None:
            file_utils.urlretrieve = real


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split(" -- ", 1)[1] if " -- " in text else text


def arrays(name: str):
    """((x, y), (x_test, y_test)) as the toolkit takes them: uint8 (N, H, W, C), int labels (N,)."""
    (x, y), (xv, yv) = _fetch(name)
    out = []
    for images, labels in ((x, y), (xv, yv)):
        images = np.asarray(images, np.uint8)
        if images.ndim == 3:  # the MNISTs: (N, 28, 28) greyscale
            images = images[..., None]
        out.append((images, np.asarray(labels).reshape(-1).astype(np.int64)))
    return out


def load(name: str, config):
    (x, y), (xv, yv) = arrays(name)
    x, xv = resized(x, config.image_size, name), resized(xv, config.image_size, name)
    k = 100 if name == "cifar100" else 10
    source = from_arrays(x, y, name=name, val=(xv, yv), num_classes=config.num_classes or k)
    source.class_names = CLASS_NAMES[name] or [str(i) for i in range(k)]
    source.info = {"format": "keras.datasets", "origin": f"keras.datasets.{name}.load_data()",
                   "input_source": "memory"}
    return source
