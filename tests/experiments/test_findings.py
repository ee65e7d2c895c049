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
