"""tftoolkit.experiments.findings: the sentences a report opens with, computed from the results."""

import pandas as pd

from tftoolkit.experiments import findings, report


def _res(runs: list[dict], points: list[dict] | None = None) -> report.Results:
    return report.Results([], pd.DataFrame(points or []), pd.DataFrame(runs))


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
    empty = report.Results([], pd.DataFrame(), pd.DataFrame())
    assert "Nothing to report yet" in findings.markdown(empty)
