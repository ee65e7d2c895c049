"""engine.timer: every timed region synchronises the devices before its clock starts and before it stops.

CPU replicas run synchronously, so an unsynchronised clock reads right here and wrong on a GPU. These tests make
the asynchrony visible on CPU: ``FakeDevice`` stands for a GPU's queue (work "launched" by a call goes on after the
call returns, and only ``timer.sync`` waits for it), and each timed region of the toolkit is checked against it or
counted through it.
"""

import threading
import time

import numpy as np
import pytest

from tftoolkit.engine import loop

from helpers import lazy

timer = lazy("tftoolkit.engine.timer")  # collected without TensorFlow (tests/helpers.py)

WORK_S = 0.2


class FakeDevice:
    """Stands in for asynchronous devices: ``launch`` queues work that runs on after the call returns;
    ``sync`` (installed as timer.sync) waits for all of it, and counts the calls."""

    def __init__(self, monkeypatch):
        self.pending: list[threading.Thread] = []
        self.syncs = 0
        monkeypatch.setattr(timer, "sync", self.sync)

    def launch(self, seconds: float) -> None:
        t = threading.Thread(target=time.sleep, args=(seconds,))
        t.start()
        self.pending.append(t)

    def sync(self) -> None:
        self.syncs += 1
        while self.pending:
            self.pending.pop().join()


def test_a_region_waits_for_the_work_its_call_left_running(monkeypatch):
    dev = FakeDevice(monkeypatch)
    _, seconds = timer.timed(dev.launch, WORK_S)  # the call returns at once; the "GPU" works on
    assert seconds >= WORK_S and dev.syncs == 2


def test_a_region_does_not_pay_for_work_queued_before_it(monkeypatch):
    dev = FakeDevice(monkeypatch)
    dev.launch(WORK_S)  # an untimed call before the region left work running
    _, seconds = timer.timed(lambda: None)
    assert seconds < WORK_S / 4


def test_the_training_loop_times_each_call_as_one_synchronised_region(monkeypatch):
    import tensorflow as tf

    dev = FakeDevice(monkeypatch)

    def loop_fn(iterator, n):  # what a compiled loop call looks like from the host: returns before the devices finish
        dev.launch(WORK_S / 4)
        return tf.zeros([int(n)]), tf.zeros([2], tf.int64)

    seconds = []
    loop.drive(loop_fn, lambda start: None, start=0, total=9, steps_per_epoch=9, steps_per_loop=3,
               on_loop=lambda chunk: seconds.append(chunk.seconds))
    assert len(seconds) == 3 and dev.syncs == 2 * 3
    assert min(seconds) >= WORK_S / 4


def test_the_breakdown_pairs_cannot_carry_work_across(monkeypatch):
    from tftoolkit.measure import breakdown

    import tensorflow as tf

    dev = FakeDevice(monkeypatch)

    def full_loop(iterator, n):  # the full step: its all-reduce is still running when the call returns
        dev.launch(WORK_S)
        return tf.zeros([1]), tf.zeros([2], tf.int64)

    def compute_loop(iterator, n):  # the compute-only step: nothing left behind
        return tf.zeros([1]), tf.zeros([2], tf.int64)

    # How time_step_parts times its pairs (breakdown._time_loop: seconds per step of one loop call).
    a, b = breakdown.interleaved(lambda: breakdown._time_loop(full_loop, None, 1),
                                 lambda: breakdown._time_loop(compute_loop, None, 1), rounds=3)
    assert (a >= WORK_S).all() and (b < WORK_S / 4).all()  # the leftover is charged to the step that left it


def test_the_input_benchmark_times_each_warm_pass_in_one_region(monkeypatch, cpu_devices):
    from tftoolkit.config import RunConfig
    from tftoolkit.measure.input import bench as inputbench

    calls = []
    real = timer.timed
    monkeypatch.setattr(timer, "timed", lambda fn, *a, **k: calls.append(fn) or real(fn, *a, **k))
    r = inputbench.measure(RunConfig(replicas=2, dataset="synthetic", image_size=8, train_images=256,
                                     per_replica_batch=32), seconds=0.2)
    assert len(calls) == r["warm_epochs"] >= 2 and r["warm_s"] >= 0.2  # passes until the time asked for


def test_the_allreduce_bench_times_every_call_in_a_region(monkeypatch, cpu_devices):
    from tftoolkit.measure import allreduce

    calls = []
    real = timer.timed
    monkeypatch.setattr(timer, "timed", lambda fn, *a, **k: calls.append(fn) or real(fn, *a, **k))
    strategy, options, _ = allreduce.make_strategy("reduce_to_one", cpu_devices)
    t = allreduce.time_allreduce(strategy, [(1024,)], options=options, repeats=3, warmup=1, iters=2)
    assert len(calls) == 2 * (1 + 3)  # each warm-up and repeat: the chain and the same call without all-reduces
    assert t["time_raw_s"] >= t["time_s"] >= 0 and t["overhead_s"] > 0


@pytest.mark.slow
def test_a_find_batch_trial_is_a_synchronised_region(monkeypatch, tmp_path):
    from tftoolkit.config import RunConfig
    from tftoolkit.tuning import finders

    calls = []
    real = timer.timed
    monkeypatch.setattr(timer, "timed", lambda fn, *a, **k: calls.append(fn) or real(fn, *a, **k))
    result = finders.find_batch(RunConfig(replicas=1, model="small_cnn", dataset="synthetic", image_size=8,
                                          train_images=64, per_replica_batch=4), tmp_path, memory_limit_mb=50,
                                max_batch=8, quiet=True, figures=False)
    ran = result["frame"]["fits"].sum()  # on CPU a trial the estimate refuses runs no step
    assert ran >= 2 and len(calls) == ran


def test_sync_is_tensorflow_s_device_sync():
    # On these CPU replicas sync returns at once; it must not raise outside a tf.function.
    t0 = time.perf_counter()
    timer.sync()
    assert time.perf_counter() - t0 < 1.0
    with timer.region() as r:
        np.zeros(10)
    assert r.seconds >= 0
    with pytest.raises(ValueError):
        with timer.region():
            raise ValueError("a failed region still stops its clock")
