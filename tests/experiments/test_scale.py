"""Scaling study: replica lists, weak/strong batch arithmetic, speedup/efficiency, and runs end to end."""

import json
import math

import pandas as pd
import pytest

from tftoolkit import cli
from tftoolkit.experiments import scale
from tftoolkit.config import RunConfig
from tftoolkit.errors import ConfigError

from helpers import FAST

TINY = dict(dataset="synthetic", image_size=16, train_images=256, steps=6, steps_per_loop=2, timing_warmup_steps=2,
            eval_every_epoch=False, **FAST)


def test_parse_replicas():
    assert scale.parse_replicas("1,2,4") == [1, 2, 4]
    assert scale.parse_replicas("4,1,2") == [1, 2, 4]
    assert scale.parse_replicas([2, 8]) == [2, 8]
    for bad, why in (("0,1,2", ">= 1"), ("1,2,2", "more than once"), ("", "at least one"), ("1,x", "integers"),
                     ("-1,2", ">= 1")):
        with pytest.raises(ConfigError, match=why):
            scale.parse_replicas(bad)


def test_weak_scaling_keeps_the_per_replica_batch():
    cfgs = scale.configs(RunConfig(per_replica_batch=16), "1,2,4", "weak")
    assert [(c.replicas, c.per_replica_batch_size, c.global_batch_size) for c in cfgs] == [(1, 16, 16), (2, 16, 32),
                                                                                           (4, 16, 64)]
    with pytest.raises(ConfigError, match="per-replica"):
        scale.configs(RunConfig(global_batch=64), "1,2", "weak")


def test_strong_scaling_keeps_the_global_batch():
    cfgs = scale.configs(RunConfig(global_batch=64), "1,2,4", "strong")
    assert [(c.replicas, c.per_replica_batch_size, c.global_batch_size) for c in cfgs] == [(1, 64, 64), (2, 32, 64),
                                                                                           (4, 16, 64)]
    # without --global-batch: per-replica batch x the smallest count
    cfgs = scale.configs(RunConfig(per_replica_batch=16), "2,4", "strong")
    assert [c.global_batch_size for c in cfgs] == [32, 32] and cfgs[1].per_replica_batch_size == 8
    with pytest.raises(ConfigError, match="does not divide by"):
        scale.configs(RunConfig(global_batch=64), "1,2,3", "strong")
    with pytest.raises(ConfigError, match="weak or strong"):
        scale.configs(RunConfig(), "1,2", "diagonal")
    # With --accumulate K the kept global batch counts the micro-batches: 16 x 2 replicas x K=2 = 64 at every count.
    cfgs = scale.configs(RunConfig(per_replica_batch=16, accumulate=2), "2,4", "strong")
    assert [(c.global_batch_size, c.per_replica_batch_size, c.accumulate) for c in cfgs] == [(64, 16, 2), (64, 8, 2)]
    with pytest.raises(ConfigError, match="does not divide by .* x accumulate 2"):
        scale.configs(RunConfig(global_batch=36, accumulate=2), "1,2,4", "strong")  # 36 = 4 x 2 x 4.5


def test_speedup_and_efficiency_relative_to_the_smallest_count():
    rows = [{"replicas": n, "global_batch": 16 * n, "per_replica_batch": 16, "images_per_sec": t, "uncertainty": e,
             "status": "ok"} for n, t, e in ((4, 300.0, 10.0), (1, 100.0, 5.0), (2, 180.0, 6.0))]
    t = scale.table(rows, "weak")
    assert list(t.columns) == scale.COLUMNS and t["replicas"].tolist() == [1, 2, 4]
    assert t["speedup"].tolist() == pytest.approx([1.0, 1.8, 3.0])
    assert t["efficiency"].tolist() == pytest.approx([1.0, 0.9, 0.75])
    assert (t["baseline_replicas"] == 1).all() and (t["mode"] == "weak").all()
    assert t["speedup_uncertainty"].iloc[2] == pytest.approx(3.0 * math.hypot(10 / 300, 5 / 100))
    t = scale.table([r for r in rows if r["replicas"] != 1], "strong")  # no 1-replica run: baseline 2
    assert (t["baseline_replicas"] == 2).all()
    assert t["speedup"].tolist() == pytest.approx([1.0, 300 / 180])
    assert t["efficiency"].iloc[1] == pytest.approx(300 / 180 / 2)


@pytest.mark.slow
def test_weak_scaling_study_on_one_and_two_replicas(tmp_path):
    # Short runs: the whole of each may go to measuring (--measure-budget 1), so that every breakdown is taken
    frame = scale.scale(RunConfig(per_replica_batch=8, measure_budget=1.0, **TINY), "1,2", tmp_path, "weak",
                        quiet=True)
    csv = pd.read_csv(tmp_path / "scaling.csv")
    assert list(csv.columns) == scale.COLUMNS and len(csv) == len(frame) == 2
    assert csv["replicas"].tolist() == [1, 2] and csv["global_batch"].tolist() == [8, 16]
    assert csv["per_replica_batch"].tolist() == [8, 8] and (csv["status"] == "ok").all()
    assert csv["speedup"].iloc[0] == 1.0 and csv["efficiency"].iloc[1] == pytest.approx(csv["speedup"].iloc[1] / 2)
    assert (csv["images_per_sec"] > 0).all()
    for col in ("step_time_s", "compute_time_s"):
        assert (csv[col] > 0).all(), col
    # A share where its parts were measured; NaN where a part is within noise or failed (its sign is not known).
    for col, parts in (("communication_fraction", ("allreduce_time_status", "compute_time_status")),
                       ("input_wait_fraction", ("input_wait_status",))):
        measured = csv[list(parts)].eq("measured").all(axis=1)
        assert csv.loc[measured, col].between(0, 1).all() and csv.loc[~measured, col].isna().all(), col
    assert csv["imbalance"].tolist() == [1.0, 1.0]
    for n in (1, 2):
        summary = json.loads((tmp_path / "runs" / f"r{n}" / "summary.json").read_text())
        assert summary["replicas"] == n and summary["images_per_sec"] == pytest.approx(
            csv.loc[csv["replicas"] == n, "images_per_sec"].iloc[0])


@pytest.mark.slow
def test_strong_scaling_cli_on_two_and_four_replicas(tmp_path, capsys):
    args = ["scale", "--replica-counts", "2,4", "--mode", "strong", "--global-batch", "16", "--no-measure", "--quiet",
            "--out", str(tmp_path)]
    for k, v in TINY.items():
        args += [f"--{k.replace('_', '-')}" if not isinstance(v, bool) else
                 f"--{'' if v else 'no-'}{k.replace('_', '-')}"] + ([] if isinstance(v, bool) else [str(v)])
    assert cli.main(args) == 0
    csv = pd.read_csv(tmp_path / "scaling.csv")
    assert csv["replicas"].tolist() == [2, 4] and csv["global_batch"].tolist() == [16, 16]
    assert csv["per_replica_batch"].tolist() == [8, 4] and (csv["baseline_replicas"] == 2).all()
    assert csv["mode"].tolist() == ["strong", "strong"] and csv["speedup"].iloc[0] == 1.0
    assert csv["compute_time_s"].isna().all()  # --no-measure: no breakdown
    assert "relative to 2 replica(s)" in capsys.readouterr().out


@pytest.mark.parametrize("replicas, message", [("0,2", ">= 1"), ("2,2", "more than once")])
def test_scale_cli_bad_replica_list_is_one_line_and_exit_2(tmp_path, capsys, replicas, message):
    assert cli.main(["scale", "--replica-counts", replicas, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "scaling.csv").exists()


def test_a_count_that_timed_no_step_is_unmeasured_not_ok(caplog):
    # Failed before the fix: such a row read "ok" with images/sec NaN, and `tftoolkit scale` exited 0.
    with caplog.at_level("WARNING", logger="tftoolkit"):
        assert scale.row_status({"status": "ok", "timed_steps": 0}, "runs/r4") == "unmeasured"
    assert "runs/r4: images/sec not measured" in caplog.text and "--steps-per-loop" in caplog.text
    assert scale.row_status({"status": "ok", "timed_steps": 12}) == "ok"
    assert scale.row_status({"status": "diverged", "timed_steps": 0}) == "diverged"
