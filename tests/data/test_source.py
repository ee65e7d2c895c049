"""data.source: the synthetic set is a pure function of (seed, example index)."""

import numpy as np

from tftoolkit.config import RunConfig
from tftoolkit.data import source


def test_the_first_n_synthetic_examples_are_the_same_whatever_n():
    x, y = source.synthetic_arrays(3000, 12, 10, seed=4)
    assert x.dtype == np.uint8 and x.shape == (3000, 12, 12, 3) and y.dtype == np.int32
    for n in (1, 100, source.SYNTHETIC_BLOCK, source.SYNTHETIC_BLOCK + 1, 2500):
        xn, yn = source.synthetic_arrays(n, 12, 10, seed=4)
        np.testing.assert_array_equal(xn, x[:n])
        np.testing.assert_array_equal(yn, y[:n])
    other, _ = source.synthetic_arrays(100, 12, 10, seed=5)
    assert not np.array_equal(other, x[:100])
    assert np.bincount(y, minlength=10).min() > 250  # every class, about equally often


def test_a_limited_synthetic_run_draws_only_its_examples_and_they_are_the_full_sets_first():
    full = source.synthetic(RunConfig(dataset="synthetic", image_size=8))
    part = source.synthetic(RunConfig(dataset="synthetic", image_size=8, train_images=300))
    assert full.train_examples == source.SYNTHETIC_TRAIN and part.train_examples == 300
    np.testing.assert_array_equal(part.stores["train"].images, full.stores["train"].images[:300])
    assert part.val_examples == full.val_examples == source.SYNTHETIC_VAL
    # Classes are what makes the set learnable: each image is its class's texture plus noise.
    images = full.stores["train"].images[:2000].astype(np.float32)
    labels = full.stores["train"].labels[:2000]
    means = np.stack([images[labels == k].mean(0) for k in range(10)])
    assert np.abs(means[:, None] - means[None]).mean(axis=(2, 3, 4))[~np.eye(10, dtype=bool)].min() > 10
