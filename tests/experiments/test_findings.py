"""tftoolkit.experiments.findings: the sentences a report opens with, computed from the results."""

import pandas as pd

from tftoolkit.experiments import findings
from tftoolkit.experiments.report import results


def _res(runs: list[dict], points: list[dict] | None = None) -> results.Results:
    return results.Results([], pd.DataFrame(points or []), pd.DataFrame(runs))


def _run(**kw):
    base = {"source": "s", "status": "ok", "error": None, "replicas": 2, "global_batch": 128, "lr_rule": "none",
            "warmup_epochs": 0.0, "val_accuracy": 0.5, "device_kind": "GPU"}
    return {**base, **kw}


def test_scaling_and_communication():
    runs = [_run(source="sc", run=f"r{n}", replicas=n, per_replica_batch=64, global_batch=64 * n, mode="weak",
                 images_per_sec=1000 * n * eff, compute_time_s=0.01, allreduce_time_s=a)
            for n, eff, a in ((1, 1.0, 0.0), (2, 0.9, 0.004), (4, 0.8, 0.012))]
    text = " ".join(findings.scaling(_res(runs)) + findings.communication(_res(runs)))
    assert "4 replicas ran at 3200 images/s, 3.20x the 1-replica rate: 80% scaling efficiency" in text
    assert "overtakes the compute at 4 replicas (12.00 ms against 10.00 ms" in text
    runs[2]["allreduce_time_s"] = 0.002
    assert "never overtakes" in " ".join(findings.communication(_res(runs)))


def test_the_batch_study_s_result_in_words():
    runs = [_run(source="b", run=f"{b}-{r}-{w}", global_batch=b, lr_rule=r, warmup_epochs=w, val_accuracy=acc)
            for b, r, w, acc in ((128, "none", 0.0, 0.86), (1024, "none", 0.0, 0.55), (1024, "linear", 1.0, 0.83),
                                 (1024, "linear", 0.0, 0.40), (4096, "linear", 1.0, 0.62), (4096, "none", 0.0, 0.30))]
    runs.append(_run(source="b", run="ns", global_batch=128, val_accuracy=0.80, noise_scale=900.0))
    text = " ".join(findings.batch_and_lr(_res(runs)))
    assert "128: none (86%); 1024: linear + 1-epoch warmup (83%); 4096: linear + 1-epoch warmup (62%)" in text
    assert "holds** up to batch 1024 (8x the smallest): 83% against 86% at batch 128, 28 points above no scaling" in text
    assert "**The regime ends** at batch 4096" in text and "24 points below" in text
    # When every batch run holds, the regime's end is stated from the measured noise scale.
    held = [r for r in runs if r["global_batch"] != 4096]
    text = " ".join(findings.batch_and_lr(_res(held)))
    assert "**The regime reaches the largest batch run** (1024)" in text and "B_simple ~ 900" in text
    assert "B_simple ~ 900" in text


def test_failures_are_listed_and_nothing_to_report_is_said():
    points = [{"id": "00_a", "status": "ok", "error": None}, {"id": "01_b", "status": "failed", "error": "ValueError: x"}]
    assert "1 of 2 did not finish normally:** 01_b (failed: ValueError: x)" in findings.failures(_res([], points))[0]
    empty = results.Results([], pd.DataFrame(), pd.DataFrame())
    assert "Nothing to report yet" in findings.markdown(empty)


def _measured(n, headroom, verdict, kind="GPU", **kw):
    """A run of a scaling study, with the input verdict a run's summary carries (runs.py), or without (None)."""
    fields = {} if verdict is None else {"input_headroom": headroom, "input_verdict": verdict}
    return _run(source="sc", run=f"r{n}", replicas=n, images_per_sec=1000.0 * n, device_kind=kind,
                point_params=None, **{"config.replicas": n, "config.seed": 0}, **fields, **kw)


def test_input_bound_points_are_named_with_their_headroom():
    runs = [_measured(1, 4.0, "fed"), _measured(2, 1.6, "near"), _measured(4, 0.8, "input-bound"),
            _measured(8, 0.5, "input-bound")]
    (line,) = findings.input_capacity(_res(runs))
    assert line.startswith("**Input:** input-bound at replicas=8 (headroom 0.50); replicas=4 (headroom 0.80). "
                           "Close to the limit at replicas=2 (headroom 1.60). Fed in the other 1 measured run(s).")
    assert "the GPUs waited" in line and "--data-service" in line
    assert "simulated" not in line and "Not measured" not in line
    assert line in findings.markdown(_res(runs))  # in the report's "what we found" block


def test_every_run_fed_says_the_least_headroom():
    runs = [_measured(1, 6.0, "fed"), _measured(2, 3.0, "fed"), _measured(4, 2.5, "fed", status="diverged")]
    assert findings.input_capacity(_res(runs)) == [
        "**Input kept up** in all 3 measured run(s): the input alone could deliver at least 2.5x what training "
        "consumed (the least at replicas=4)."]


def test_old_runs_say_input_capacity_was_not_measured():
    runs = [_measured(1, None, None), _measured(2, None, None)]
    (line,) = findings.input_capacity(_res(runs))
    assert line.startswith("**Input capacity:** not measured for these runs")
    # A mix: the measured runs give the verdict, the older ones are counted.
    runs.append(_measured(4, 0.9, "input-bound"))
    (line,) = findings.input_capacity(_res(runs))
    assert "input-bound at replicas=4 (headroom 0.90)" in line and line.endswith("Not measured in 2 older run(s).")
    # No training runs at all (a sweep of a user's own notebook): no sentence about input.
    assert findings.input_capacity(_res([])) == []


def test_simulated_replicas_read_the_headroom_as_the_share_of_the_cores():
    # Input and compute shared the 2 cores: headroom 1.5 means the input needed 1/1.5 = 67% of their time.
    runs = [_measured(1, 3.0, "fed", kind="CPU-simulated"), _measured(2, 1.5, "near", kind="CPU-simulated")]
    (line,) = findings.input_capacity(_res(runs))
    assert "Close to the limit at replicas=2 (headroom 1.50)." in line
    assert ("On simulated CPU replicas input and compute shared the host's cores, so there the headroom is not a GPU "
            "server's verdict: 1 / headroom is the share of the cores' time the input needed (67% at replicas=2)") in line
    assert "the GPUs waited" not in line  # no GPU waited here


def test_a_failure_without_an_error_message_is_not_called_nan():
    points = [{"id": "00_a", "status": "diverged", "error": float("nan")}]
    assert findings.failures(_res([], points)) == ["**1 of 1 did not finish normally:** 00_a (diverged)."]


def _scaling_runs(parts):
    """Scaling runs with breakdown parts: {replicas: (compute, its error, all-reduce, its error[, all-reduce status])}."""
    return [_run(source="sc", run=f"r{n}", replicas=n, per_replica_batch=64, global_batch=64 * n, mode="weak",
                 images_per_sec=1000.0 * n, compute_time_s=c, compute_time_uncertainty_s=ce, allreduce_time_s=a,
                 allreduce_time_uncertainty_s=ae, **({"allreduce_time_status": rest[0]} if rest else {}))
            for n, (c, ce, a, ae, *rest) in parts.items()]


def test_no_communication_finding_from_a_part_within_noise():
    # The demo's runs: the all-reduce 28.2 ± 24.1 ms at 2 replicas, 0.00 at 4: within noise at both. The old finding
    # read "its largest share is 26% of the step, at 2 replicas".
    runs = _scaling_runs({1: (0.017, 0.002, 0.0, 0.0), 2: (0.080, 0.010, 0.0282, 0.0241),
                          4: (0.150, 0.020, 0.0, 0.004)})
    (line,) = findings.communication(_res(runs))
    assert "26%" not in line and "largest share" not in line and "overtakes the compute at" not in line
    assert line.startswith("**Communication:** the all-reduce's cost is not shown by these runs")
    assert "2 replicas: 28.20 ± 24.10 ms (within noise)" in line and "4 replicas: 0.00 ± 4.00 ms (within noise)" in line
    # Measured above its noise at 4 replicas: the share is stated there, with its error; 2 replicas is named as noise.
    runs = _scaling_runs({1: (0.017, 0.002, 0.0, 0.0), 2: (0.080, 0.010, 0.0282, 0.0241),
                          4: (0.150, 0.002, 0.050, 0.004)})
    (line,) = findings.communication(_res(runs))
    assert "largest share measured above noise is 25% ± 2% of the step, at 4 replicas" in line
    assert "Not shown at 2 replicas: 28.20 ± 24.10 ms (within noise)." in line
    # An all-reduce above the compute but not beyond their joint noise does not "overtake" it.
    runs = _scaling_runs({1: (0.017, 0.002, 0.0, 0.0), 2: (0.040, 0.008, 0.048, 0.006)})
    assert "overtakes the compute at" not in findings.communication(_res(runs))[0]
    # The summary's own status wins: a failed measurement is never a finding.
    runs = _scaling_runs({1: (0.017, 0.002, 0.0, 0.0), 2: (0.040, 0.002, 0.060, 0.002, "failed")})
    (line,) = findings.communication(_res(runs))
    assert "not shown" in line and "(failed)" in line


def test_within_noise_is_decided_in_one_place():
    from tftoolkit.measure import stats

    assert stats.within_noise(0.0282, 0.0241) is True and stats.within_noise(0.050, 0.004) is False
    assert stats.within_noise(-0.05, 0.01) is False  # far from zero, on either side
    assert stats.within_noise(0.01, float("nan")) is None and stats.within_noise(None, 0.1) is None
    assert stats.differ(0.048, 0.006, 0.040, 0.008) is False and stats.differ(0.06, 0.002, 0.04, 0.002) is True
    assert stats.differ(0.06, None, 0.04, 0.002) is None


def _demo_batch_runs():
    """The demo's batch sweep: every rule at the ~98% ceiling at every batch; the best run at 256 had no warmup."""
    acc = {32: {("none", 0.0): 0.982, ("linear", 1.0): 0.981, ("linear", 0.0): 0.980, ("sqrt", 1.0): 0.979},
           64: {("none", 0.0): 0.978, ("linear", 1.0): 0.983, ("linear", 0.0): 0.981, ("sqrt", 1.0): 0.980},
           128: {("none", 0.0): 0.975, ("linear", 1.0): 0.980, ("linear", 0.0): 0.982, ("sqrt", 1.0): 0.979},
           256: {("none", 0.0): 0.968, ("linear", 1.0): 0.979, ("linear", 0.0): 0.984, ("sqrt", 1.0): 0.977}}
    return [_run(source="b", run=f"{b}-{r}-{w}", global_batch=b, lr_rule=r, warmup_epochs=w, val_accuracy=a)
            for b, rules in acc.items() for (r, w), a in rules.items()]


def _noise_run(value, lo, hi, batch, early=None):
    return _run(source="b", run=f"ns{batch}", global_batch=batch, lr_rule="linear", warmup_epochs=1.0,
                val_accuracy=0.98, noise_scale=value, noise_scale_interval_lo=lo, noise_scale_interval_hi=hi,
                noise_scale_reliable=True, noise_scale_early=early)


def test_batch_findings_agree_with_the_runs():
    # The demo report said "linear scaling with warmup holds up to 256" (the best run at 256 had no warmup, and every
    # rule sat at the 98% ceiling), "B_simple ~ 116 (median of 3 runs)" (their intervals do not overlap), and that the
    # noise scale says where the regime should end (256 held, 2.2x past 116).
    runs = _demo_batch_runs() + [_noise_run(272, 209, 409, 32), _noise_run(97, 81, 138, 64, early=True),
                                 _noise_run(116, 97, 156, 128)]
    text = " ".join(findings.batch_and_lr(_res(runs)))
    assert "with warmup holds" not in text and "median of 3 runs)" not in text
    assert "**The sweep cannot separate the LR rules:** at every batch up to 256" in text
    assert "256: no rule better than another (all within 5 points: 97%-98%)" in text
    assert ("the 3 runs disagree: 272 [209-409] at batch 32, 97 [81-138] at batch 64, 116 [97-156] at batch 128 "
            "(90% intervals), which do not overlap") in text
    assert "Measured while it was still growing in 1 of 3 run(s)" in text
    assert "says where it should end" not in text  # 256 lies within the runs' intervals: neither confirmed nor not
    assert "neither confirm nor contradict" in text
    # One run's noise scale, with its interval; 256 held though 2.2x past it: said, not glossed over.
    runs = _demo_batch_runs() + [_noise_run(116, 97, 156, 128)]
    text = " ".join(findings.batch_and_lr(_res(runs)))
    assert "B_simple ~ 116 examples, 90% interval 97-156 (1 run at batch 128)" in text
    assert ("The runs contradict the noise scale as the regime's end: batch 256 is 2.2x past the measured B_simple ~ "
            "116 [97-156] and still held") in text


def test_linear_without_warmup_is_not_called_with_warmup():
    runs = [_run(source="b", run=f"{b}-{r}", global_batch=b, lr_rule=r, warmup_epochs=0.0, val_accuracy=a)
            for b, r, a in ((128, "none", 0.86), (1024, "none", 0.55), (1024, "linear", 0.84))]
    text = " ".join(findings.batch_and_lr(_res(runs)))
    assert "**Linear scaling (no warmup) holds** up to batch 1024" in text and "with warmup" not in text


def test_the_power_cap_is_reported_apart_from_slowdowns(tmp_path):
    # summary.json's monitor block, as measure.monitor.summarize writes it, read by the report's loader.
    run = tmp_path / "h200" / "runs" / "r1"
    run.mkdir(parents=True)
    summary = {"status": "ok", "replicas": 1, "noise_scale_interval": [97.0, 156.0], "monitor": {
        "flags": ["gpu1 slowed down in 20% of samples (hw_thermal_slowdown): a thermal or hardware slowdown"],
        "notes": ["gpu0 ran at its software power cap in 74% of samples (sw_power_cap): ... not a cooling fault"]}}
    (run / "summary.json").write_text(__import__("json").dumps(summary))
    row = results._run_row(run, tmp_path / "h200")
    assert (row["noise_scale_interval_lo"], row["noise_scale_interval_hi"]) == (97.0, 156.0)
    res = _res([_run(run="r1", **{k: row[k] for k in ("monitor_flags", "monitor_notes")})])
    flags, cap = findings.hardware(res)
    assert flags.startswith("**Hardware monitor flags:** r1: gpu1 slowed down in 20% of samples (hw_thermal_slowdown)")
    assert cap.startswith("**Power cap (not a fault):** r1: gpu0 ran at its software power cap in 74% of samples")
    assert "cooling" not in cap.replace("not a cooling fault", "")
    assert findings.hardware(_res([_run(run="r1")])) == []  # no monitor: nothing said


def test_a_mean_below_zero_is_never_measured_within_three_errors_and_failed_beyond():
    # Runs whose all-reduce came out 2.5 errors below zero (within noise in each run: a part is failed only beyond
    # 3, measure.parts.FAIL_SIGMAS): the mean is no finding, and 3.5 errors below it is a failed measurement.
    near = pd.DataFrame([_run(allreduce_time_s=-0.005, allreduce_time_uncertainty_s=0.002)])
    assert findings.part_status(near, "allreduce_time_s") == (-0.005, 0.002, findings.WITHIN_NOISE)
    far = pd.DataFrame([_run(allreduce_time_s=-0.007, allreduce_time_uncertainty_s=0.002)])
    assert findings.part_status(far, "allreduce_time_s")[2] == findings.FAILED
    above = pd.DataFrame([_run(allreduce_time_s=0.005, allreduce_time_uncertainty_s=0.002)])
    assert findings.part_status(above, "allreduce_time_s")[2] == findings.MEASURED


def test_a_headroom_within_noise_of_its_line_is_named_so_in_the_finding():
    # 1.20 ± 0.05 is within 2 errors of the input-bound line (1.25): named with its error and what else it may be
    runs = [_measured(2, 1.20, "input-bound", input_headroom_uncertainty=0.05),
            _measured(4, 0.60, "input-bound", input_headroom_uncertainty=0.02)]
    (line,) = findings.input_capacity(_res(runs))
    assert "replicas=4 (headroom 0.60 ± 0.02)" in line
    assert "replicas=2 (headroom 1.20 ± 0.05, may be close to the limit)" in line
    # Every run fed, the least headroom 2.1 ± 0.1: "at least" with its error and that it may be close to the limit
    (line,) = findings.input_capacity(_res([_measured(2, 2.1, "fed", input_headroom_uncertainty=0.1),
                                            _measured(4, 3.0, "fed", input_headroom_uncertainty=0.1)]))
    assert "at least 2.1x what training consumed (± 0.1, may be close to the limit; the least at replicas=2)" in line
