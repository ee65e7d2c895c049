"""Advice from the noise scale: the McCandlish trade-off, the recommendation, the files and the bad input.
Run directories are written by hand (no training), as a run copied from a GPU server would arrive."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from tftoolkit.planner import comms, forecast, validation

from tftoolkit.tuning import advise
from tftoolkit.cli import main
from tftoolkit.errors import ConfigError, RunDirError


def _wait(n, run_replicas=2):
    """The straggler factor of n GPUs against the run's own replicas (predict's and advise's step: the published
    rows' sigma)."""
    return forecast.straggler_factor(validation.release()["straggler"], n, run_replicas)


def _run_dir(tmp_path, name="run", steps=True, **fields):
    d = tmp_path / name
    d.mkdir()
    s = {"replicas": 2, "per_replica_batch": 32, "global_batch": 64, "noise_scale": 500.0, "noise_scale_steps": 120,
         "params": 1_000_000, "compute_time_s": 0.05, "device_kind": "GPU", **fields}
    (d / "summary.json").write_text(json.dumps(s))
    if steps:
        pd.DataFrame({"step": range(1, 21), "loss": np.linspace(2, 1, 20),
                      "noise_scale": np.linspace(300, 500, 20)}).to_csv(d / "steps.csv", index=False)
    return d


def test_steps_and_examples_lie_on_the_hyperbola():
    b = np.array([1, 10, 100, 1000, 1e4])
    s, e = advise.steps_ratio(b, 100.0), advise.examples_ratio(b, 100.0)
    np.testing.assert_allclose((s - 1) * (e - 1), 1.0)
    assert advise.steps_ratio(100, 100) == 2 and advise.examples_ratio(100, 100) == 2


@pytest.mark.parametrize("b_crit, per_replica, replicas, global_batch", [
    (500.0, 32, 16, 512),      # 500/32 = 15.6 -> 16 GPUs
    (700.0, 32, 16, 512),      # 21.9 -> log2 4.45 rounds to 16
    (800.0, 32, 32, 1024),     # 25 -> log2 4.64 rounds to 32
    (1e6, 32, 64, 2048),       # capped at 64
    (64.0, 64, 1, 64),         # exactly one replica's batch
])
def test_recommendation_is_the_power_of_two_closest_to_b_crit(b_crit, per_replica, replicas, global_batch):
    rec = advise.recommend(b_crit, per_replica, max_replicas=64)
    assert (rec["replicas"], rec["global_batch"]) == (replicas, global_batch)
    assert rec["steps_ratio"] == pytest.approx(1 + b_crit / global_batch)
    assert ("capped" in rec["note"]) == (b_crit == 1e6)


def test_per_replica_batch_above_b_crit_recommends_one_gpu_and_a_smaller_batch():
    rec = advise.recommend(20.0, 64)
    assert rec["replicas"] == 1 and rec["global_batch"] == 16 and rec["per_replica_batch"] == 16
    assert "alone exceeds the critical batch" in rec["note"]


@pytest.mark.parametrize("bad", [0.0, -3.0, math.nan, math.inf])
def test_non_positive_noise_scale_is_refused(bad):
    with pytest.raises(ConfigError, match="noise scale must be"):
        advise.recommend(bad, 32)


def test_advise_writes_advice_tradeoff_and_figures(tmp_path):
    run = _run_dir(tmp_path)
    r = advise.advise(run, interconnect="nvlink4")
    assert r["recommended"]["replicas"] == 16 and r["recommended"]["global_batch"] == 512
    assert r["current"] == {"replicas": 2, "global_batch": 64, "steps_ratio": pytest.approx(1 + 500 / 64),
                            "examples_ratio": pytest.approx(1 + 64 / 500)}
    frame = pd.read_csv(run / "tradeoff.csv")
    assert frame["replicas"].tolist() == [1, 2, 4, 8, 16, 32, 64]
    assert frame.loc[frame["recommended"], "replicas"].tolist() == [16]
    assert frame.loc[frame["current"], "replicas"].tolist() == [2]
    # Time to the same loss: S(B)/S(b) x t(N)/t(1); on NVLink 4 with 50 ms of compute, 4 MB of gradients.
    row = frame.set_index("replicas").loc[16]

    # The slowest of N replicas sets a synchronous step: 50 ms measured on the run's 2 replicas, x _wait(N).
    t16 = 0.05 * _wait(16) + comms.allreduce_time(4e6, 8, 2, comms.PRESETS["nvlink4"], comms.PRESETS["ib200"])
    assert row["time_ratio"] == pytest.approx((1 + 500 / 512) / (1 + 500 / 32) * t16 / (0.05 * _wait(1)))
    assert json.loads((run / "advice.json").read_text())["time_model"]["fastest_replicas"] == 64
    assert (run / "tradeoff.png").stat().st_size > 20_000 and (run / "noise_scale.png").exists()


def test_cli_advise_prints_the_recommendation(tmp_path, capsys):
    run = _run_dir(tmp_path, steps=False)
    assert main(["advise", str(run), "--out", str(tmp_path / "adv"), "--per-replica-batch", "128"]) == 0
    out = capsys.readouterr().out
    assert "recommended: 4 GPU(s) x 128 = global batch 512" in out
    assert (tmp_path / "adv" / "advice.json").exists() and not (tmp_path / "adv" / "noise_scale.png").exists()


def test_cli_advise_bad_run_directories(tmp_path, capsys):
    no_ns = _run_dir(tmp_path, "plain")
    s = json.loads((no_ns / "summary.json").read_text())
    del s["noise_scale"]
    (no_ns / "summary.json").write_text(json.dumps(s))
    assert main(["advise", str(no_ns)]) == 2
    assert "lacks field(s) noise_scale (train with --noise-scale)" in capsys.readouterr().err
    nan_ns = _run_dir(tmp_path, "nan", noise_scale=math.nan)
    assert main(["advise", str(nan_ns)]) == 1  # nothing to recommend from: said, exit 1, no made-up batch
    out = capsys.readouterr().out
    assert "NOT RELIABLE: the averaged |G|^2 estimate is not positive" in out and "no recommendation" in out
    assert json.loads((nan_ns / "advice.json").read_text())["recommended"] is None
    assert main(["advise", str(tmp_path / "missing")]) == 2
    assert "has no summary.json" in capsys.readouterr().err
    with pytest.raises(RunDirError):
        advise.read_run(tmp_path / "missing")


def _per_step_run(tmp_path, name, grad_sq, trace, final_loss=1.0, classes=10):
    d = _run_dir(tmp_path, name, steps=False, final_loss_mean10=final_loss, num_classes=classes)
    n = len(grad_sq)
    pd.DataFrame({"step": range(1, n + 1), "loss": np.full(n, final_loss), "noise_grad_sq": grad_sq,
                  "noise_trace": trace, "noise_scale": np.asarray(trace) / np.asarray(grad_sq)}).to_csv(
        d / "steps.csv", index=False)
    return d


def test_advise_takes_the_ratio_of_averages_over_the_later_half_with_an_interval(tmp_path):
    rng = np.random.default_rng(0)
    # Per-step unbiased estimates scatter (|G|^2 around 0.02 with noise 0.01); their means give B = 250.
    g = 0.02 + 0.01 * rng.standard_normal(400)
    t = 5.0 + 1.0 * rng.standard_normal(400)
    run = _per_step_run(tmp_path, "good", g, t)
    r = advise.advise(run, figures=False)
    assert r["reliable"] and r["warnings"] == [] and r["noise_scale_steps"] == 200
    assert r["noise_scale"] == pytest.approx(t[200:].mean() / g[200:].mean())
    lo, hi = r["noise_scale_interval"]
    assert lo < r["noise_scale"] < hi and hi / lo < 3 and r["recommended"]["replicas"] == 8


def test_advise_does_not_recommend_from_a_run_that_did_not_learn(tmp_path, capsys):
    # The run: at chance (loss 2.307 ~ ln 10), per-step ratios swinging from 97 to 10865 with NaN rows, and a
    # last value (1234) that advise used to take as B_crit.
    rng = np.random.default_rng(1)
    g = 0.001 + 0.004 * rng.standard_normal(300)
    t = 2.0 + 0.5 * rng.standard_normal(300)
    g[::37] = np.nan
    run = _per_step_run(tmp_path, "chance", g, t, final_loss=2.307, classes=10)
    assert main(["advise", str(run)]) in (0, 1)
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("NOT RELIABLE: the loss stayed near ln(10) = 2.303")
    advice = json.loads((run / "advice.json").read_text())
    assert advice["reliable"] is False and any("factor of 3" in w or "not positive" in w for w in advice["warnings"])
    if advice["recommended"] is not None:  # a recommendation, if any, comes after every warning
        assert out.index("recommended:") > max(out.index(w[:40]) for w in advice["warnings"])


def test_too_few_steps_are_not_reliable():
    from tftoolkit import noise_scale

    est = noise_scale.robust_estimate(np.full(40, 0.02), np.full(40, 5.0))
    assert est["noise_scale"] == pytest.approx(250.0) and est["steps"] == 20
    assert any("only 20 valid steps" in w for w in noise_scale.reliability(est))


# A GPU at 150 images/s (15 images per 100 ms step on one replica) on a host whose input delivers 100 images/s per
# core on 4 cores: 400 images/s.
FED_BY_4_CORES = {"replicas": 1, "per_replica_batch": 15, "global_batch": 15, "step_time_s": 0.1, "params": 1,
                  "input_capacity_per_core": 100.0, "input_cores": 4, "workers": 1}


def test_advise_names_the_gpu_count_where_input_becomes_the_limit(tmp_path, capsys):
    run = _run_dir(tmp_path, steps=False, **FED_BY_4_CORES)
    assert main(["advise", str(run), "--max-replicas", "8"]) == 0
    out = capsys.readouterr().out
    # No interconnect given: the compute alone, N x 150 images/s, the most N GPUs could consume.
    assert ("input limit (compute alone: no all-reduce, the most the GPUs could consume): input becomes the limit at 3 "
            "GPUs: they would consume 450 images/s, the input delivers 400; 5 cores per host would feed them, or 1 "
            "more host of 4 cores as tf.data service workers; at 8 GPUs (1,200 images/s) 12 cores per host would "
            "feed them, or 2 more hosts of 4 cores") in out
    il = json.loads((run / "advice.json").read_text())["input_limit"]
    assert (il["limit_replicas"], il["host_capacity_images_per_sec"], il["per_core_images_per_sec"]) == (3, 400.0, 100.0)
    assert (il["at_largest"]["replicas"], il["at_largest"]["cores_needed_per_host"],
            il["at_largest"]["service_workers_needed"]) == (8, 12, 2)
    frame = pd.read_csv(run / "input_limit.csv")
    assert frame["replicas"].tolist() == list(range(1, 9))
    assert frame["input_limited"].tolist() == [False, False, True, True, True, True, True, True]
    # With an interconnect, its time model gives the images/sec (here the link costs nothing: the same answer). At a
    # per-replica batch of 30 the step's compute doubles (200 ms): still 150 images/s a GPU. On 2 cores (200 images/s)
    # the limit is at 2 GPUs.
    r = advise.advise(run, tmp_path / "adv", interconnect="fast=1000000:0", per_replica_batch=30, max_replicas=8,
                      host_cores=2, figures=False)
    il = r["input_limit"]
    assert il["throughput_model"] == "predict's model over fast + ib200"
    assert (il["host_cores"], il["host_cores_from"], il["limit_replicas"]) == (2, "--host-cores", 2)
    # 8 GPUs x 150 = 1200 images/s: 12 cores, or ceil((1200 - 200) / 200) = 5 more 2-core hosts.
    assert (il["at_largest"]["cores_needed_per_host"], il["at_largest"]["service_workers_needed"]) == (12, 5)
    assert r["input_frame"]["global_batch"].tolist() == [30 * n for n in range(1, 9)]


def test_advise_on_a_run_without_input_capacity_or_gpu_compute(tmp_path, capsys):
    old = _run_dir(tmp_path, "old", steps=False)  # written before runs measured their input
    assert main(["advise", str(old)]) == 0
    out = capsys.readouterr().out
    assert "recommended: 16 GPU(s)" in out and out.rstrip().endswith(
        "input limit: input capacity not measured in this run\nwritten: " + f"{old}/advice.json, tradeoff.csv, tradeoff.png")
    assert json.loads((old / "advice.json").read_text())["input_limit"] == {
        "forecast": False, "why": "input capacity not measured in this run"}
    assert not (old / "input_limit.csv").exists()
    # CPU-simulated compute says nothing of a GPU's images/sec: the input's figures, no GPU count.
    sim = _run_dir(tmp_path, "sim", steps=False, **{**FED_BY_4_CORES, "device_kind": "CPU-simulated"})
    il = advise.advise(sim, figures=False)["input_limit"]
    assert il["forecast"] is False and il["host_capacity_images_per_sec"] == 400.0
    assert il["why"].startswith("no GPU throughput to compare it with: this run's compute")
    # No noise scale to recommend from: the input limit is still said.
    nan_ns = _run_dir(tmp_path, "nan", steps=False, **{**FED_BY_4_CORES, "noise_scale": math.nan})
    assert main(["advise", str(nan_ns), "--max-replicas", "8"]) == 1
    assert "input becomes the limit at 3 GPUs" in capsys.readouterr().out


def test_advise_bad_host_cores_is_one_line_exit_2(tmp_path, capsys):
    run = _run_dir(tmp_path, steps=False, **FED_BY_4_CORES)
    assert main(["advise", str(run), "--host-cores", "0"]) == 2
    err = capsys.readouterr().err
    assert "--host-cores must be a whole number of cores >= 1, got 0" in err and len(err.strip().splitlines()) == 1


# --- past the memory cap: accumulation ----------------------------------------------------------------------
def test_recommendation_past_the_gpu_cap_accumulates_when_the_memory_cap_is_known():
    # B_crit 16384 on 32 per replica asks for 512 GPUs; 64 are allowed and a replica holds 128.
    rec = advise.recommend(16384.0, 32, 64, max_per_replica_batch=128)
    assert (rec["replicas"], rec["global_batch"], rec["per_replica_batch"], rec["accumulate"]) == (64, 16384, 128, 2)
    assert rec["train_with"] == "--replicas 64 --per-replica-batch 128 --accumulate 2"
    assert rec["steps_ratio"] == pytest.approx(2.0)
    assert rec["note"].startswith("64 GPU(s) x 128 x accumulate 2 = global batch 16384")
    # Without the cap it stops at 64 x 32, as before.
    rec = advise.recommend(16384.0, 32, 64)
    assert (rec["global_batch"], rec["accumulate"]) == (2048, 1) and "capped at 64 GPUs" in rec["note"]
    # Where one pass holds it, the per-replica batch rises instead: 4096 / 64 = 64 <= 256.
    rec = advise.recommend(4096.0, 32, 64, max_per_replica_batch=256)
    assert (rec["global_batch"], rec["per_replica_batch"], rec["accumulate"]) == (4096, 64, 1)
    assert "the per-replica batch rises to 64" in rec["note"]
    # Within the GPUs nothing changes.
    assert advise.recommend(500.0, 32, 64, max_per_replica_batch=128)["global_batch"] == 512
    with pytest.raises(ConfigError, match="per-replica batch 64 is over the 32 that fits"):
        advise.recommend(500.0, 64, 64, max_per_replica_batch=32)


def test_advise_reads_the_cap_from_find_batch_and_says_the_accumulate(tmp_path, capsys):

    run = _run_dir(tmp_path, steps=False, noise_scale=16384.0)
    found = tmp_path / "fb"
    found.mkdir()
    (found / "batch_find.json").write_text(json.dumps({"max_per_replica_batch": 128, "device_kind": "GPU",
                                                       "capped_at_max_batch": False}))
    assert main(["advise", str(run), "--batch-find", str(found)]) == 0
    out = capsys.readouterr().out
    assert "recommended: 64 GPU(s) x 128 x accumulate 2 = global batch 16384, closest to the critical batch" in out
    assert (f"train with --replicas 64 --per-replica-batch 128 --accumulate 2 (a replica holds at most 128: find-batch "
            f"({found / 'batch_find.json'}, on GPU))") in out
    advice = json.loads((run / "advice.json").read_text())
    assert (advice["recommended"]["accumulate"], advice["recommended"]["per_replica_batch"]) == (2, 128)
    assert advice["max_per_replica_batch"] == 128 and advice["per_replica_batch"] == 32
    frame = pd.read_csv(run / "tradeoff.csv")
    rec = frame[frame["recommended"]].iloc[0]
    assert (rec["replicas"], rec["global_batch"], rec["per_replica_batch"], rec["accumulate"]) == (64, 16384, 128, 2)
    # With a time model the accumulation is costed: 2 micro-steps of 128, each 4 x the run's 50 ms at 32, and one
    # all-reduce over 8 hosts. On the same 64 GPUs the larger batch takes more examples, so more time, to the same
    # loss: the time model recommends 64 x 32 and says what the critical batch alone asked for.
    assert main(["advise", str(run), "--batch-find", str(found), "--interconnect", "nvlink4"]) == 0
    out = capsys.readouterr().out
    frame = pd.read_csv(run / "tradeoff.csv")
    pick = frame[frame["critical_batch"]].iloc[0]
    assert (pick["replicas"], pick["global_batch"], pick["accumulate"]) == (64, 16384, 2)
    comm = comms.allreduce_time(4e6, 8, 8, comms.PRESETS["nvlink4"], comms.PRESETS["ib200"])
    assert pick["step_time_s"] == pytest.approx(2 * 0.2 * _wait(64) + comm)
    rec = frame[frame["recommended"]].iloc[0]
    assert (rec["replicas"], rec["global_batch"], rec["accumulate"]) == (64, 2048, 1)
    assert pick["time_vs_recommended"] == pytest.approx(
        (1 + 16384 / 16384) / (1 + 16384 / 2048) * (2 * 0.2 * _wait(64) + comm) / (0.05 * _wait(64) + comm))
    assert ("recommended: 64 GPU(s) x 32 = global batch 2048, the least time x GPU-time to the same loss over nvlink4 "
            "(the critical batch 1.64e+04 alone would ask for global batch 16384 (--replicas 64 --per-replica-batch 128 "
            f"--accumulate 2), which takes {pick['time_vs_recommended']:.2f}x the time") in out
    # The same cap given directly.
    r = advise.advise(run, tmp_path / "direct", max_per_replica_batch=128, figures=False)
    assert r["recommended"]["train_with"] == "--replicas 64 --per-replica-batch 128 --accumulate 2"
    assert r["max_per_replica_batch_source"] == "--max-per-replica-batch"


def test_advise_of_an_accumulating_run_shows_its_accumulate(tmp_path):
    run = _run_dir(tmp_path, steps=False, global_batch=128, accumulate=2)
    r = advise.advise(run, figures=False)
    assert (r["current"]["global_batch"], r["current"]["per_replica_batch"], r["current"]["accumulate"]) == (128, 32, 2)
    cur = r["frame"][r["frame"]["current"]].iloc[0]
    assert (cur["replicas"], cur["global_batch"], cur["accumulate"]) == (2, 128, 2)


@pytest.mark.parametrize("args, message", [
    (["--max-per-replica-batch", "64", "--batch-find", "x"], "give --max-per-replica-batch or --batch-find, not both"),
    (["--max-per-replica-batch", "0"], "--max-per-replica-batch must be a whole number of examples >= 1, got 0"),
    (["--batch-find", "nowhere"], "does not exist; write it with `tftoolkit find-batch --out DIR`"),
    (["--max-per-replica-batch", "16", "--per-replica-batch", "32"],
     "--per-replica-batch 32 is over the 16 a replica holds (--max-per-replica-batch); give 16 or less"),
])
def test_advise_bad_memory_cap_is_one_line_exit_2(tmp_path, capsys, args, message):
    run = _run_dir(tmp_path, steps=False)
    assert main(["advise", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (run / "advice.json").exists()


def test_advise_refusal_names_only_advise_options_and_it_takes_gpus_per_host(tmp_path, capsys):
    sim = _run_dir(tmp_path, "sim", steps=False, device_kind="CPU-simulated")
    r = advise.advise(sim, figures=False, interconnect="pcie4")
    text = advise.advice_text(r)
    assert "is written in its summary.json as on CPU-simulated" in text and "measured on" not in text
    assert "--compute-ms" not in text and "--devices" not in text and "leave out --interconnect" in text
    # A cluster of 4-GPU hosts: 8 GPUs are two hosts joined by the inter-host link.
    gpu = _run_dir(tmp_path, "gpu", steps=False)
    assert main(["advise", str(gpu), "--interconnect", "nvlink3", "--gpus-per-host", "4"]) == 0
    four = pd.read_csv(gpu / "tradeoff.csv").set_index("replicas")["step_time_s"]
    assert main(["advise", str(gpu), "--interconnect", "nvlink3", "--gpus-per-host", "8"]) == 0
    eight = pd.read_csv(gpu / "tradeoff.csv").set_index("replicas")["step_time_s"]
    assert four.loc[8].max() > eight.loc[8].max()  # ib200 between two hosts costs more than NVLink inside one


# --- the time model: one recommendation, the fastest count in its terms ------------------------------------------
@pytest.mark.parametrize("b_crit", [40.0, 300.0, 500.0, 700.0, 800.0, 1e6])
def test_with_free_communication_the_time_rule_is_the_critical_batch_rule(tmp_path, b_crit):
    # A link that costs nothing: the step time stays 50 ms at every count, so the least time x GPU-time
    # (S/S_min x E/E_min) is the power of two closest to B_crit: the same count recommend() names.
    run = _run_dir(tmp_path, steps=False, noise_scale=b_crit)
    r = advise.advise(run, figures=False, interconnect="free=1000000:0", inter_host="free=1000000:0")
    assert r["recommended"]["replicas"] == advise.recommend(b_crit, 32, 64)["replicas"]
    tm = r["time_model"]
    assert tm["recommended_replicas"] == tm["critical_batch_replicas"] == r["recommended"]["replicas"]
    frame = pd.read_csv(run / "tradeoff.csv")
    assert frame.loc[frame["recommended"], "replicas"].tolist() == [r["recommended"]["replicas"]]
    assert (frame["recommended"] == frame["critical_batch"]).all()


def test_the_fastest_count_is_stated_in_the_recommendation_s_terms(tmp_path, capsys):
    # Up to 512 GPUs: the fastest to the same loss is always the largest count (steps keep falling), far past the
    # recommended 16; advise says how much sooner it is and at how many times the GPU-time, everywhere it reports.
    run = _run_dir(tmp_path, steps=False)
    assert main(["advise", str(run), "--interconnect", "nvlink4", "--max-replicas", "512"]) == 0
    out = capsys.readouterr().out
    frame = pd.read_csv(run / "tradeoff.csv").set_index("replicas")
    tm = json.loads((run / "advice.json").read_text())["time_model"]
    t, g = frame["time_ratio"], frame["gpu_time_ratio"]
    assert (tm["recommended_replicas"], tm["fastest_replicas"]) == (16, 512)
    assert tm["fastest_speedup_vs_recommended"] == pytest.approx(t[16] / t[512])
    assert tm["fastest_gpu_time_vs_recommended"] == pytest.approx(g[512] / g[16]) and g[512] / g[16] > 10
    assert frame["fastest"].tolist() == [r == 512 for r in frame.index]
    assert frame.loc[512, "time_vs_recommended"] == pytest.approx(t[512] / t[16])
    assert frame.loc[512, "gpu_time_vs_recommended"] == pytest.approx(g[512] / g[16])
    # The rule is the least time x GPU-time; each doubling past 16 buys less than sqrt(2).
    product = t * g
    assert product.idxmin() == 16
    assert all(t[n // 2] / t[n] < math.sqrt(2) for n in (32, 64, 128, 256, 512))
    assert all(t[n // 2] / t[n] >= math.sqrt(2) for n in (2, 4, 8, 16))
    assert "recommended by the GPU count with the least (time to the same loss) x (GPU-time to it)" in out
    assert (f"fastest to the same loss: 512 GPUs, {t[16] / t[512]:.2f}x sooner than the recommended 16 at "
            f"{g[512] / g[16]:.2f}x its GPU-time (each doubling past 16 cuts the time by less than 1.41x: "
            f"{t[16] / t[32]:.2f}x to 32,") in out


def test_a_slow_link_between_hosts_moves_the_recommendation_below_the_critical_batch(tmp_path, capsys):
    # 0.5 GB/s between hosts of 8: past one host each doubling cuts the time to the same loss by less than sqrt(2),
    # so the recommendation is the one host of 8, not the 16 the critical batch 500 alone asks for.
    run = _run_dir(tmp_path, steps=False)
    assert main(["advise", str(run), "--interconnect", "nvlink4", "--inter-host", "slow=0.5:0"]) == 0
    out = capsys.readouterr().out
    advice = json.loads((run / "advice.json").read_text())
    assert advice["recommended"]["replicas"] == 8 and advice["recommended"]["train_with"] == (
        "--replicas 8 --per-replica-batch 32")
    assert advice["time_model"]["critical_batch_replicas"] == 16
    frame = pd.read_csv(run / "tradeoff.csv").set_index("replicas")
    assert frame["recommended"].tolist() == [r == 8 for r in frame.index]
    assert frame["critical_batch"].tolist() == [r == 16 for r in frame.index]
    t = frame["time_ratio"]
    assert t[4] / t[8] >= math.sqrt(2) > t[8] / t[16]
    assert ("recommended: 8 GPU(s) x 32 = global batch 256, the least time x GPU-time to the same loss over nvlink4 "
            "(the critical batch 500 alone would ask for global batch 512 (--replicas 16 --per-replica-batch 32), but "
            "with the all-reduce there a doubling past 8 GPU(s) cuts the time by less than 1.41x)") in out
    assert "fastest to the same loss: 64 GPUs" in out and "than the recommended 8 at" in out


def test_every_multiple_carries_the_noise_scale_s_interval(tmp_path, capsys):
    # B_crit 250 with a 90% interval: S/S_min = 1 + B_crit/B rises with it, E/E_min = 1 + B/B_crit falls.
    rng = np.random.default_rng(0)
    run = _per_step_run(tmp_path, "good", 0.02 + 0.01 * rng.standard_normal(400), 5.0 + rng.standard_normal(400))
    r = advise.advise(run, figures=False)
    (lo, hi), cur, rec = r["noise_scale_interval"], r["current"], r["recommended"]
    assert cur["examples_ratio_interval"] == pytest.approx([1 + 64 / hi, 1 + 64 / lo])
    assert cur["steps_ratio_interval"] == pytest.approx([1 + lo / 64, 1 + hi / 64])
    b = rec["global_batch"]
    assert rec["examples_ratio_interval"] == pytest.approx([1 + b / hi, 1 + b / lo])
    out = advise.advice_text(r)
    assert (f"current: 2 replica(s), global batch 64: {cur['steps_ratio']:.2f} x the fewest steps (90% interval "
            f"{1 + lo / 64:.3g}-{1 + hi / 64:.3g}), {cur['examples_ratio']:.2f} x the fewest examples (90% interval "
            f"{1 + 64 / hi:.3g}-{1 + 64 / lo:.3g})") in out
    assert out.count("90% interval") == 6  # the noise scale's, its growth's, and each of the four multiples'


def test_a_noise_scale_still_growing_is_called_early_training(tmp_path, capsys):
    # tr(Sigma) doubles over the run while |G|^2 stays: the noise scale grows 100 -> 200 (as the loss falls).
    rng = np.random.default_rng(2)
    n = 600
    g = 0.02 + 0.002 * rng.standard_normal(n)
    t = np.linspace(2.0, 4.0, n) + 0.2 * rng.standard_normal(n)
    run = _per_step_run(tmp_path, "growing", g, t)
    r = advise.advise(run, figures=False)
    assert r["noise_scale_early"] is True and r["noise_scale_growth_interval"][0] > 1
    assert r["noise_scale_growth"] == pytest.approx(t[450:].mean() / g[450:].mean() / (t[300:450].mean()
                                                                                      / g[300:450].mean()))
    out = advise.advice_text(r)
    first_not_warning = out.splitlines()[0]
    assert first_not_warning.startswith("EARLY TRAINING: the noise scale was measured over steps 301-600 of 600, while "
                                        "it was still growing: it grew 1.")
    assert "understates the batch that pays off later" in first_not_warning
    assert out.index("EARLY TRAINING") < out.index("recommended:")
    # A steady noise scale is not called early; its phase is still said.
    steady = _per_step_run(tmp_path, "steady", g, 3.0 + 0.2 * rng.standard_normal(n))
    r = advise.advise(steady, figures=False)
    assert r["noise_scale_early"] is False and "EARLY TRAINING" not in advise.advice_text(r)
    assert "noise scale measured over steps 301-600 of 600; it grew" in advise.advice_text(r)


def test_growth_knows_the_answer_and_when_it_cannot_tell():
    from tftoolkit import noise_scale

    n = 400
    g = np.full(n, 0.01)
    t = np.r_[np.full(300, 1.0), np.full(100, 3.0)]  # in the window (steps 200-400): 1.0 then 3.0 per half
    grew = noise_scale.growth(g, t)
    assert grew["ratio"] == pytest.approx(3.0) and grew["early"] is True
    assert noise_scale.growth(g[:30], t[:30])["early"] is None  # 7 steps a half: too few to tell
    g2 = np.r_[np.full(300, 0.01), np.full(100, -0.01)]  # the second half's |G|^2 lost in the noise
    assert noise_scale.growth(g2, t)["early"] is None


def test_the_figures_draw_the_noise_scale_s_interval(tmp_path):
    from tftoolkit.plots import batch as bplots

    rng = np.random.default_rng(0)
    run = _per_step_run(tmp_path, "good", 0.02 + 0.01 * rng.standard_normal(400), 5.0 + rng.standard_normal(400))
    r = advise.advise(run, figures=False)
    lo, hi = r["noise_scale_interval"]
    frame = r["frame"]
    assert frame["b_crit_lo"].eq(lo).all() and frame["b_crit_hi"].eq(hi).all()
    labels = [t.get_text() for t in bplots.tradeoff(frame).axes[1].get_legend().get_texts()]
    assert f"B_simple 90% interval {lo:.3g}-{hi:.3g}" in labels
    steps = pd.read_csv(run / "steps.csv")
    est = advise.estimate({}, steps)
    assert est["from_step"] == 201
    labels = [t.get_text() for t in bplots.noise_scale_trace(steps, est).axes[0].get_legend().get_texts()]
    assert f"90% interval {lo:.3g}-{hi:.3g}" in labels and any(x.startswith("the run's B_simple") for x in labels)


def test_the_time_model_s_multiples_carry_the_interval_too(tmp_path):
    rng = np.random.default_rng(0)
    run = _per_step_run(tmp_path, "good", 0.02 + 0.01 * rng.standard_normal(400), 5.0 + rng.standard_normal(400))
    r = advise.advise(run, figures=False, interconnect="nvlink4", max_replicas=512)
    tm, (lo, hi) = r["time_model"], r["noise_scale_interval"]
    frame = r["frame"].set_index("replicas")
    n, fast = tm["recommended_replicas"], tm["fastest_replicas"]
    base, rec, f = (frame.loc[k] for k in (1, n, fast))

    def t(row, bc):
        return (1 + bc / row["global_batch"]) / (1 + bc / base["global_batch"]) * row["step_time_s"] / base["step_time_s"]

    assert tm["fastest_speedup_vs_recommended_interval"] == pytest.approx(
        sorted(t(rec, bc) / t(f, bc) for bc in (lo, hi)))
    a, b = tm["recommended_time_ratio_interval"]
    assert a <= tm["recommended_time_ratio"] <= b
    text = advise.advice_text(r)
    iv = tm["fastest_speedup_vs_recommended_interval"]
    assert f"{tm['fastest_speedup_vs_recommended']:.2f}x (90% interval {iv[0]:.3g}-{iv[1]:.3g}) sooner" in text
    assert text.count("90% interval") == 6 + 4  # the noise scale, its growth, 4 costs, 4 time multiples


def test_an_open_growth_interval_is_said_in_words():
    from tftoolkit import noise_scale

    text = noise_scale.phase_text([126, 250, 250], {"ratio": 4.19, "interval": [2.54, math.inf], "early": True})
    assert text.startswith("measured over steps 126-250 of 250, while it was still growing: it grew 4.19x (90% "
                           "interval 2.54 or more)")
