"""The default recipe learns, on shapes16k (BENCHMARKS.md has the full 5-epoch figures) and on images a user
brings in class folders: greyscale, of mixed sizes, resized on load."""

import numpy as np
import pytest
from PIL import Image, ImageDraw

import tftoolkit
from tftoolkit.config import RunConfig

CLASSES = ("disc", "square", "triangle", "bar")


def _draw(kind: str, side: int, rng) -> Image.Image:
    im = Image.new("L", (side, side), int(rng.integers(0, 90)))
    d = ImageDraw.Draw(im)
    r = side * rng.uniform(0.25, 0.4)
    cx, cy = side / 2 + rng.uniform(-0.1, 0.1) * side, side / 2 + rng.uniform(-0.1, 0.1) * side
    ink = int(rng.integers(150, 256))
    if kind == "disc":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=ink)
    elif kind == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=ink)
    elif kind == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=ink)
    else:
        d.rectangle([cx - r, cy - r / 4, cx + r, cy + r / 4], fill=ink)
    return im


@pytest.fixture(scope="module")
def grey_folders(tmp_path_factory):
    """PATH/train/<class>/*.png and PATH/val/<class>/*.png, greyscale, 20..60 pixels a side, not square-sized
    alike: what a user's own small image set looks like."""
    root = tmp_path_factory.mktemp("grey")
    rng = np.random.default_rng(0)
    for split, n in (("train", 240), ("val", 60)):
        for kind in CLASSES:
            (root / split / kind).mkdir(parents=True)
            for i in range(n):
                _draw(kind, int(rng.integers(20, 61)), rng).save(root / split / kind / f"{i}.png")
    return root


@pytest.mark.slow
def test_default_recipe_learns_greyscale_images_of_any_size_from_class_folders(grey_folders, tmp_path):
    cfg = RunConfig(replicas=2, per_replica_batch=32, epochs=6, dataset=str(grey_folders), measure=False)
    d = RunConfig()
    # Only what the data forces is set: the recipe (model, optimiser, LR, rule, warmup, schedule) is the default.
    assert (cfg.model, cfg.optimizer, cfg.base_lr, cfg.lr_rule, cfg.schedule) == (
        d.model, d.optimizer, d.base_lr, d.lr_rule, d.schedule)
    s = tftoolkit.train(cfg, tmp_path / "run", quiet=True)
    assert s["status"] == "ok"
    assert s["val_accuracy"] >= 0.9, s["val_accuracy"]  # 4 classes: chance is 0.25
