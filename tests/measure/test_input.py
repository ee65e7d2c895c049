"""`tftoolkit bench input` on a dataset that streams: its rate, per core, and against the decode-only ceiling."""

import json
import math
import re

import numpy as np
import pytest

from tftoolkit import cli
from tftoolkit.data import stream

import formats


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("inet")
    formats.imagenet_tfrecords(out, classes=3, train=96, validation=8, train_shards=4, validation_shards=1,
                               sizes=(40, 80), seed=1)
    return out


def _bench(capsys, path, *extra):
    rc = cli.main(["bench", "input", "--dataset", str(path), "--replicas", "2", "--global-batch", "16",
                   "--image-size", "32", "--augment", "--seconds", "0.5", "--json", *extra])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out[out.index("{"):])


def test_a_streamed_dataset_reports_its_rate_per_core_and_against_decoding_alone(shards, capsys):
    r = _bench(capsys, shards, "--data-memory-gb", "1e-6")
    assert r["source"] == "stream" and r["input_transform"] == "inception + augment"
    assert r["cores"] == stream.cores() and r["input_threads"]["decode_threads"] == r["cores"]
    assert r["input_threads"]["interleave_cycle"] == 4  # one per shard, at most 16
    assert r["images_per_sec"] > 0 and r["images_per_sec_per_core"] == pytest.approx(r["images_per_sec"] / r["cores"])
    # The ceiling is the same files decoded alone, and the fraction is the pipeline's rate of it. How close the
    # two come is a timing (two 0.5 s windows at different moments: 1.79 once under the suite's own load), so it
    # is a benchmark's figure (BENCHMARKS.md), not asserted here.
    assert r["decode_images_per_sec"] > 0
    assert r["decode_ceiling_fraction"] == pytest.approx(r["images_per_sec"] / r["decode_images_per_sec"])
    assert r["warm_images"] >= 16 and r["train_examples"] == 96


def test_the_same_dataset_in_memory_has_no_decode_ceiling(shards, capsys):
    r = _bench(capsys, shards, "--data-memory-gb", "64")
    assert r["source"] == "memory" and r["input_transform"] == "" and r["input_threads"] == {}
    assert r["decode_images_per_sec"] is None or math.isnan(r["decode_images_per_sec"])
    assert r["cold_images"] == 96 and r["cold_s"] > 0  # decoded once, when it loaded



def test_with_accumulation_an_epoch_is_its_micro_batches_and_the_batch_line_says_so(shards, capsys):
    # Global batch 16 on 2 replicas x 2 micro-batches of 4: each element is one micro-batch, and a timed pass is
    # still whole epochs (96 // 16 = 6 steps = 12 elements of 8 images).
    # One bench, its table read: the batch line is per_replica_batch and accumulate, the warm line its images and
    # epochs (the JSON of the same fields is the tests above).
    rc = cli.main(["bench", "input", "--dataset", str(shards), "--replicas", "2", "--global-batch", "16",
                   "--accumulate", "2", "--image-size", "32", "--seconds", "0.2", "--data-memory-gb", "64"])
    out = capsys.readouterr().out
    assert rc == 0 and "global batch 16 = 4 per replica x 2 x 2 micro-batches" in out
    warm = re.search(r"\((\d+) images in [\d.]+ s, (\d+) epoch\(s\)\)", out)
    assert warm, out
    warm_images, warm_epochs = int(warm[1]), int(warm[2])
    assert warm_epochs >= 1 and warm_images == warm_epochs * 96 - 8  # the trace pulled one element


# --- the input verdict every run carries (pure arithmetic, no TensorFlow) -------------------------------------------
@pytest.mark.parametrize("capacity, consumed, verdict", [
    (1000.0, 1000.0, "input-bound"),   # headroom 1.0: the GPUs waited for input
    (1240.0, 1000.0, "input-bound"),   # 1.24 < 1.25
    (1250.0, 1000.0, "near"),
    (1990.0, 1000.0, "near"),
    (2000.0, 1000.0, "fed"),
    (800.0, 1000.0, "input-bound"),    # below 1: training cannot have been faster than its input; still input-bound
])
def test_the_verdict_compares_the_input_capacity_with_what_training_consumed(capacity, consumed, verdict):
    from tftoolkit.measure.input.verdict import verdict as judge

    v = judge(capacity, consumed, "GPU")
    assert v["input_headroom"] == pytest.approx(capacity / consumed)
    assert v["input_verdict"] == verdict
    assert f"{capacity:,.0f} images/sec" in v["input_note"] and f"{consumed:,.0f}" in v["input_note"]
    assert "share the cores" not in v["input_note"]  # a GPU run's input has the cores to itself


def test_on_simulated_replicas_the_verdict_says_what_share_of_the_cores_input_needed():
    from tftoolkit.measure.input.verdict import verdict as judge

    # Capacity 4000 measured with the cores to itself; training consumed 1000 while compute ran on the same cores:
    # the input's work for 1000 images/sec takes 1000 / 4000 of the cores' time.
    v = judge(4000.0, 1000.0, "CPU-simulated")
    assert v["input_verdict"] == "fed" and v["input_headroom"] == pytest.approx(4.0)
    assert "about 25% of their time" in v["input_note"]
    v = judge(1100.0, 1000.0, "CPU-simulated")
    assert v["input_verdict"] == "input-bound" and "about 91% of their time" in v["input_note"]


def test_the_probe_s_rate_is_the_slope_through_its_calls_with_the_slope_s_error():
    from tftoolkit.measure.input.verdict import MIN_CALLS, rate

    # Calls of 64 ... 2048 images, each 1.6 ms of fixed cost plus 3.2 us an image (312,500 images/s): the slope
    # gives the rate without the fixed cost, which all images over all seconds would take as input time
    images = [64, 128, 256, 512, 1024, 2048]
    exact = [0.0016 + 3.2e-6 * i for i in images]
    r, se = rate(images, exact)
    assert r == pytest.approx(312_500) and se == pytest.approx(0, abs=1e-6)
    assert sum(images) / sum(exact) < 0.8 * r  # what the old total ratio said
    # Noise on the seconds: the slope's standard error (n - 2 degrees of freedom), carried to the rate
    noisy = [t + d for t, d in zip(exact, [1e-4, -2e-4, 1e-4, 2e-4, -1e-4, -1e-4])]
    r, se = rate(images, noisy)
    x, y = np.array(images, float), np.array(noisy)
    slope, cost = np.polyfit(x, y, 1)
    resid = y - (cost + slope * x)
    assert r == pytest.approx(1 / slope)
    assert se == pytest.approx(math.sqrt(resid @ resid / 4 / ((x - x.mean()) ** 2).sum()) / slope**2)
    assert 0.01 * r < se < 0.1 * r
    # Too few calls for an error (a slow pipeline's probe), or a line that does not rise: the total ratio, no error
    few = rate(images[:MIN_CALLS - 1], exact[:MIN_CALLS - 1])
    assert few[0] == pytest.approx(sum(images[:4]) / sum(exact[:4])) and math.isnan(few[1])
    assert math.isnan(rate([64] * 6, [0.01, 0.02, 0.01, 0.02, 0.01, 0.02])[1])
    assert all(math.isnan(v) for v in rate([], []))


@pytest.mark.parametrize("capacity, se, verdict, others", [
    (1300.0, 50.0, "near", ["input-bound"]),                 # 1.30 ± 0.06: within 2 errors of 1.25
    (1200.0, 50.0, "input-bound", ["near"]),
    (2100.0, 100.0, "fed", ["near"]),                        # 2.1 ± 0.1
    (1950.0, 100.0, "near", ["fed"]),
    (1600.0, 300.0, "near", ["input-bound", "fed"]),         # 1.6 ± 0.3: either side
    (3000.0, 600.0, "fed", ["near"]),                        # 3.0 ± 0.6: down to 1.8
    (3000.0, 900.0, "fed", ["input-bound", "near"]),         # 3.0 ± 0.9: down to 1.2
    (1600.0, 20.0, "near", []),                              # 1.60 ± 0.03: clear of both lines
    (1250.0, 0.0, "near", []),                               # on the line with no error: nothing to say
])
def test_a_headroom_within_noise_of_a_line_says_what_else_it_may_be(capacity, se, verdict, others):
    from tftoolkit.measure.input.verdict import WORDS, kinds_within_noise, verdict as judge

    consumed_se = 20.0 if se else 0.0
    v = judge(capacity, 1000.0, "GPU", se, consumed_se)
    assert v["input_verdict"] == verdict  # the figures' verdict, whatever the noise
    assert v["input_headroom_uncertainty"] == pytest.approx(capacity / 1000 * math.hypot(se / capacity,
                                                                                           consumed_se / 1000))
    assert kinds_within_noise(v["input_headroom"], v["input_headroom_uncertainty"]) == others
    assert f"{capacity:,.0f} ± {se:,.0f} images/sec" in v["input_note"]
    said = "within 2 standard errors it may be " + " or ".join(WORDS[k] for k in others)
    assert (said in v["input_note"]) == bool(others), v["input_note"]
    assert ("may be" in v["input_note"]) == bool(others), v["input_note"]
    assert kinds_within_noise(1.3, math.nan) == []  # an error not known says nothing


@pytest.mark.parametrize("capacity, consumed", [(float("nan"), 100.0), (100.0, float("nan")), (0.0, 10.0), (10.0, 0.0)])
def test_an_unmeasured_capacity_or_rate_gives_no_verdict(capacity, consumed):
    from tftoolkit.measure.input.verdict import verdict as judge

    v = judge(capacity, consumed, "GPU")
    assert v["input_verdict"] == "" and math.isnan(v["input_headroom"]) and v["input_note"] == "input capacity not measured"
