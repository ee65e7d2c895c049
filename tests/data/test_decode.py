"""data/decode.py: a JPEG cut short, or whose headers break off, is refused by the toolkit's own structure check
before TensorFlow's decoder (libjpeg) sees it, so the one-line error is all that reaches stderr."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
LIBJPEG = ("Improper call to JPEG library", "Input file read error", "Premature end of JPEG")

# In memory (the split fits): the load's own error. Streamed (a budget too small): an evaluation pass meets the bad
# file and bad_records.explain_error names it, as a run does. C-level stderr is only seen from another process.
SCRIPT = """
import sys
from tftoolkit import RunConfig
from tftoolkit.data import bad_records, registry
from tftoolkit.errors import DataError

for root in sys.argv[1:]:
    try:
        registry.load(RunConfig(dataset=root, image_size=16))
        print("loaded")
    except DataError as e:
        print("memory:", e, flush=True)
    cfg = RunConfig(dataset=root, image_size=16, replicas=1, per_replica_batch=4, data_memory_gb=1e-6)
    split = registry.load(cfg).streams["train"]
    try:
        for _ in split.eval_dataset(cfg, (1, 1, 0)):
            pass
        print("streamed all")
    except Exception as e:
        print("stream:", bad_records.explain_error(e, [split]), flush=True)
"""


def _folder(root: Path, damage) -> Path:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(root / c / f"{i}.jpg", quality=90)
    bad = root / "a" / "0.jpg"
    bad.write_bytes(damage(bad.read_bytes()))
    return root


@pytest.mark.slow  # a TensorFlow interpreter of its own (6.6 s alone, 9 s in test-fast's workers); make test runs it
def test_a_damaged_jpeg_gives_the_one_line_error_and_no_libjpeg_text(tmp_path):
    cut = _folder(tmp_path / "cut", lambda b: b[:len(b) // 2])               # a partial copy, cut in its headers
    broken = _folder(tmp_path / "broken", lambda b: b[:200] + bytes(300))   # headers break off before the scan
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(cut), str(broken)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    for where, reason in ((cut, "it is a JPEG cut short"), (broken, "it is a damaged JPEG")):
        line = f"cannot use {where / 'a' / '0.jpg'}: {reason}"
        assert any(o.startswith(f"memory: {line}") for o in out), out
        assert any(o.startswith(f"stream: {line}") for o in out), out
    leaked = [line for line in done.stderr.splitlines() if any(text in line for text in LIBJPEG)]
    assert not leaked, leaked


@pytest.mark.parametrize("trailer", [b"", b"\x00" * 64, b"\xff\xda\x00\x10" + bytes(100)])
def test_a_whole_jpeg_passes_the_structure_check_whatever_follows_its_end(tmp_path, trailer):
    import tensorflow as tf

    from tftoolkit.data.decode import checked_encoding, jpeg_structure

    path = tmp_path / "x.jpg"
    Image.fromarray(np.full((9, 13, 3), 200, np.uint8)).save(path, quality=90, exif=Image.Exif())
    data = path.read_bytes() + trailer
    scan, ends, broken = jpeg_structure(tf.constant(data))
    assert int(scan) > 0 and bool(ends) and not bool(broken)
    assert tf.io.decode_image(checked_encoding(tf.constant(data))).shape == (9, 13, 3)
    for cut in (int(scan) + 20, int(scan) // 2):  # cut inside the scan, inside the headers
        _, ends, broken = jpeg_structure(tf.constant(data[:cut]))
        assert not bool(ends) and not bool(broken)
