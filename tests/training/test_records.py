"""training.records.summary: both kinds of summary.json (a train run's, a RunRecorder's) built from hand-made records
alone, with no TensorFlow and no training, and checked against tftoolkit/summary.py's field table."""

import logging
import math

import pytest
from helpers import assert_no_tensorflow

from tftoolkit import summary as summary_schema
from tftoolkit.config import RunConfig
from tftoolkit.engine.devices import DeviceSetup
from tftoolkit.training.records import summary as records_summary

# Fields only some runs have: measure=True, noise_scale=True, profile_steps.
CONDITIONAL_GROUPS = {"breakdown (measure=True)", "FLOPs (measure=True)", "gradient noise scale (noise_scale=True)",
                      "profiler (profile_steps)"}
EVERY_RUN = {f.name for f in summary_schema.FIELDS.values() if f.group not in CONDITIONAL_GROUPS}

# What the toolkit's own loop knows and a user's model.fit does not: a recorded fit's summary leaves these out.
TRAIN_ONLY = {"resumed_from_step", "segments", "run_wall_time_s", "wall_breakdown", "cross_device_ops_requested",
              "jit_effective", "deterministic", "deterministic_reason", "dataset", "num_classes",
              "examples_per_replica", "dropped_examples", "input_sharding", "data_placement", "data_placement_reason",
              "input_source", "input_threads", "input_transform", "skipped_images", "skipped_image_examples",
              "base_lr", "base_batch", "warmup_epochs", "input_capacity_images_per_sec", "input_capacity_method",
              "input_cores", "input_capacity_per_core", "input_headroom", "input_verdict", "input_note",
              "input_capacity_uncertainty", "input_headroom_uncertainty", "data_service"}

# Three timed loops of 5 steps each: per-step times 0.1, 0.05, 0.05 s; mean 1/15 s.
LOOPS = [(0.5, 5), (0.25, 5), (0.25, 5)]
ROWS = [{"step": i + 1, "epoch": i // 6, "loss": float(12 - i), "step_time_s": 0.05, "learning_rate": 0.01 * (i + 1)}
        for i in range(12)]  # losses 12, 11, ..., 1; LR rising to 0.12
EVALS = [{"epoch": 0, "step": 6, "val_loss": 3.0, "val_accuracy": 0.5, "val_examples": 100, "val_top2": 0.7},
         {"epoch": 1, "step": 12, "val_loss": 2.0, "val_accuracy": 0.75, "val_examples": 100, "val_top2": 0.9}]


def train_facts(**over):
    facts = {"replicas": 2, "cross_device_ops": "reduce_to_one", "threads": {}, "params": 1000,
             "gradient_bytes": 4000, "allreduce_dtype": "float32", "dataset": "shapes16k", "train_examples": 384,
             "num_classes": 4, "jit_effective": False, "deterministic": True, "deterministic_reason": "CPU",
             "device_memory_peak_bytes": None, "resumed_from_step": 0, "examples_per_replica": [384, 384],
             "dropped_examples": 0, "data_placement": "host", "data_placement_reason": "asked for", "loss": "xent"}
    return {**facts, **over}


def train_summary(config=None, capacity=None, **over):
    config = config or RunConfig(replicas=2, per_replica_batch=32, base_lr=0.1, base_batch=64, lr_rule="linear")
    setup = DeviceSetup("CPU-simulated", ("/cpu:0", "/cpu:1"), None, 2)
    kw = dict(status="ok", error=None, steps=12, steps_per_epoch=6, loop_times=LOOPS, rows=ROWS, evals=EVALS,
              initial_loss=2.5, metric_names=["top2"], worker_shard=False,
              input_info={"input_source": "stream", "transform": "inception", "input_threads": {"cores": 2}},
              streamed=True, skipped=[(2, ["a.jpg", "b.jpg"]), (5, ["c", "d", "e", "f", "g"])],
              capacity={"input_capacity_images_per_sec": 1440.0, "input_capacity_method": "measured",
                        "input_cores": 2, "input_capacity_per_core": 720.0} if capacity is None else capacity)
    kw.update(over)
    summary = records_summary.train_summary(config, setup, train_facts(), **kw)
    summary["monitor"] = {}
    summary.update(records_summary.wall_fields(summary, wall_time_s=10.0, parts=dict.fromkeys(records_summary.WALL_PARTS,
                                                                                            1.0),
                                             first_call=(1.0, 5)))
    return summary


def fit_summary(**over):
    facts = {"replicas": 2, "workers": 1, "replicas_per_worker": 2, "device_kind": "CPU-simulated",
             "devices": ["/cpu:0", "/cpu:1"], "cross_device_ops": "CollectiveAllReduce(RING)", "threads": {},
             "device_memory_peak_bytes": None, "model": "mine", "params": 1000, "gradient_bytes": 4000,
             "precision": "float32", "jit_compile": False, "optimizer": "adam", "loss": "mse", "metrics": ["mae"],
             "learning_rate": 0.001}
    kw = dict(status="ok", error=None, steps=12, steps_per_epoch=6, global_batch=64, loop_times=LOOPS, rows=ROWS,
              evals=EVALS, epoch_logs={"loss": 1.5, "mae": 0.25, "val_loss": 2.0}, train_examples=384.0)
    kw.update(over)
    summary = records_summary.fit_summary(facts, **kw)
    summary["monitor"] = {}
    summary["wall_time_s"] = 10.0
    return summary


def test_the_builder_and_the_run_module_import_no_tensorflow():
    # The builder runs on records alone; training.run is imported by the CLI before session.start, which times
    # TensorFlow's import apart (wall_breakdown's import_s).
    assert_no_tensorflow("import tftoolkit.training.records, tftoolkit.training.run")


def test_a_train_summary_has_every_field_of_the_table_and_only_documented_ones():
    summary = summary_schema.check(train_summary())
    assert EVERY_RUN - set(summary) == set()
    assert set(summary) - set(summary_schema.FIELDS) == {"val_top2"}  # a metric's: documented by its rule
    assert summary_schema.is_metric("val_top2")


def test_a_recorded_fit_summary_has_the_table_but_what_only_train_knows():
    summary = summary_schema.check(fit_summary())
    assert EVERY_RUN - set(summary) == TRAIN_ONLY
    assert {"train_mae", "val_top2"} <= set(summary)


def test_the_shared_fields_are_computed_the_same_from_the_same_records():
    train, fit = train_summary(), fit_summary()
    shared = set(records_summary.recorded_fields("ok", None, steps=12, steps_per_epoch=6, global_batch=64,
                                               loop_times=LOOPS, losses=[1.0], evals=EVALS)) - {"initial_loss"}
    assert len(shared) > 15
    for name in shared:
        a, b = train[name], fit[name]
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), name


def test_throughput_and_losses_from_the_records():
    s = train_summary()
    assert s["global_batch"] == 64 and s["per_replica_batch"] == 32 and s["learning_rate"] == pytest.approx(0.1)
    assert s["images_per_sec"] == pytest.approx(64 / (0.2 / 3))  # 64 images / the mean step time, 1/15 s
    assert s["examples_per_sec"] == s["images_per_sec"]
    assert s["step_time_s"] == pytest.approx(0.05)  # the median of 0.1, 0.05, 0.05
    assert s["timed_steps"] == 15
    assert s["steps"] == 12 and s["epochs"] == 2.0
    assert s["initial_loss"] == 2.5  # the run's own first loss, not the first row's
    assert s["final_loss"] == 1.0 and s["final_loss_mean10"] == pytest.approx(5.5)  # mean of 10, 9, ..., 1
    assert (s["val_loss"], s["val_accuracy"], s["val_top2"]) == (2.0, 0.75, 0.9)  # the last evaluation
    assert s["metrics"] == ["top2"] and s["loss"] == "xent"
    assert s["input_sharding"] == "exact"


def test_a_train_run_without_an_evaluation_or_timed_loops_has_nans():
    s = train_summary(loop_times=[], evals=[], rows=[])
    assert s["timed_steps"] == 0 and math.isnan(s["images_per_sec"])
    assert math.isnan(s["val_loss"]) and math.isnan(s["val_top2"]) and math.isnan(s["final_loss"])


def test_the_input_fields_and_the_verdict():
    s = train_summary()
    assert s["input_source"] == "stream" and s["input_transform"] == "inception"
    assert s["skipped_images"] == 7 and s["skipped_image_examples"] == ["a.jpg", "b.jpg", "c", "d", "e"]
    assert s["input_headroom"] == pytest.approx(1440 / 960) and s["input_verdict"] == "near"
    assert s["data_service"] is None
    # Without the probe's error the headroom's is not known, and nothing is said of it
    assert math.isnan(s["input_capacity_uncertainty"]) and math.isnan(s["input_headroom_uncertainty"])
    # With it: the two rates' relative errors; 1.50 ± 0.04 is clear of both lines
    sure = train_summary(capacity={"input_capacity_images_per_sec": 1440.0, "input_capacity_uncertainty": 36.0})
    rel = math.hypot(36 / 1440, sure["images_per_sec_uncertainty"] / sure["images_per_sec"])
    assert sure["input_headroom_uncertainty"] == pytest.approx(1440 / 960 * rel) and "± 36" in sure["input_note"]
    failed = train_summary(status="failed", capacity={})
    assert failed["input_capacity_method"] == "not measured (the run failed)"
    assert math.isnan(failed["input_headroom"]) and failed["input_verdict"] == ""


def test_the_wall_breakdown_splits_out_tracing_and_sums_to_the_wall_time():
    b = train_summary()["wall_breakdown"]
    # The first call: 1 s for 5 steps of a 0.05 s median step, so 0.75 s of it was tracing.
    assert b["tracing_s"] == pytest.approx(0.75) and b["train_steps_s"] == pytest.approx(0.25)
    assert sum(b.values()) == pytest.approx(10.0)
    # Seven parts of 1 s, tracing 0.75 s (it replaces the 1 s given) and the steps 0.25 s: 8 s, so 2 s other.
    assert b["other_s"] == pytest.approx(2.0)


def test_segments_of_a_resumed_run():
    s = train_summary()
    assert s["segments"] == [{"workers": 1, "replicas": 2, "status": "ok", "wall_time_s": 10.0,
                              "images_per_sec": s["images_per_sec"], "timed_steps": 15, "from_step": 0, "to_step": 12}]
    previous = {"steps": 4, "workers": 1, "replicas": 1, "status": "interrupted", "wall_time_s": 3.0}
    segs = records_summary.segments({"steps": 12, "wall_time_s": 5.0}, 8, previous)
    assert [(g["from_step"], g["to_step"], g["status"]) for g in segs] == [(0, 4, "interrupted"),
                                                                         (4, 8, "interrupted"), (8, 12, None)]
    fields = records_summary.wall_fields({"steps": 12}, wall_time_s=5.0, parts={"setup_s": 1.0}, resumed_from=8,
                                       previous=previous)
    assert fields["run_wall_time_s"] == 8.0  # 3 s and 5 s; the killed segment's time is unknown


def test_the_done_line():
    s = train_summary()
    line = records_summary.done_line(s, timed_loops=3, config=RunConfig(), classification=True, out="runs/x")
    assert line.startswith("done: 12 steps, 960.0 ± ")
    assert line.endswith("images/sec (float32, no XLA, deterministic ops, data on the host, all-reduce "
                         "reduce_to_one), final loss 1.0000, val_accuracy 0.7500 -> runs/x")
    regression = records_summary.done_line(s, timed_loops=1, config=RunConfig(), classification=False, out="o")
    assert "960.0 images/sec from one timed loop call" in regression
    assert regression.endswith("val_loss 2.0000, val_top2 0.9000 -> o")
    warm = records_summary.done_line({**s, "steps": 12}, timed_loops=0, config=RunConfig(), classification=True,
                                   out="o")
    assert "all 12 steps fell in the timing warm-up (--timing-warmup-steps 10, loops of 10)" in warm


def test_a_recorded_fit_summary_from_its_records():
    s = fit_summary()
    assert s["per_replica_batch"] == 32 and s["global_batch"] == 64
    assert s["learning_rate"] == pytest.approx(0.12)  # the peak over the rows, as train's
    assert s["initial_loss"] == 12.0  # a fit knows no other first loss than its first row's
    assert s["train_examples"] == 384 and s["train_mae"] == 0.25 and "train_loss" not in s
    assert (s["val_loss"], s["val_top2"]) == (2.0, 0.9) and "val_examples" not in s
    assert s["lr_rule"] == "none" and s["accumulate"] == 1 and s["jit"] is False
    odd = fit_summary(global_batch=63, steps_per_epoch=None, train_examples=math.nan)
    assert odd["per_replica_batch"] == 31.5 and math.isnan(odd["epochs"]) and odd["train_examples"] is None


def test_the_recorded_line():
    level, line = records_summary.recorded_line(fit_summary(), timed_loops=3, warmup_steps=10, out="runs/mine")
    assert level == logging.INFO and line.startswith("recorded: 12 steps, 960.0 ± ")
    assert line.endswith(" examples/sec, final loss 1.0000 -> runs/mine")
    level, line = records_summary.recorded_line(fit_summary(status="failed", error="boom"), timed_loops=0,
                                              warmup_steps=10, out="o")
    assert (level, line) == (logging.WARNING, "recorded fit failed: boom -> o")


def test_the_monitor_counts_this_hosts_share_of_the_timed_images(monkeypatch):
    seen = {}
    monkeypatch.setattr(records_summary.monitor_analysis, "summarize", lambda df, **kw: seen.update(kw) or {"gpus": []})
    assert records_summary.monitor_fields("m.csv", loop_times=LOOPS, global_batch=64, share=0.5) == {"gpus": []}
    assert seen == {"images": 15 * 64 * 0.5, "duration_s": 1.0, "phase": "train"}
    monkeypatch.undo()
    # The monitor never fails a run: a monitor.csv that cannot be read is no monitor field.
    assert records_summary.monitor_fields("/nonexistent/monitor.csv", loop_times=[], global_batch=None) is None

