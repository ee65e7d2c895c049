"""tftoolkit.engine.loop: the chunked driver's arithmetic, and its hooks."""

import pytest

from tftoolkit.engine import loop


@pytest.mark.parametrize("step, pos, spe, total, spl, every, n", [
    (0, 0, 10, 100, 4, 0, 4),
    (8, 8, 10, 100, 4, 0, 2),    # never past the epoch's end
    (97, 7, 10, 100, 4, 0, 3),   # nor the total
    (3, 3, 10, 100, 4, 5, 2),    # nor the next checkpoint (a multiple of every)
    (5, 5, 10, 100, 4, 5, 4),
])
def test_chunk_steps(step, pos, spe, total, spl, every, n):
    assert loop.chunk_steps(step, pos, spe, total, spl, every) == n


def _fake_loop(calls):
    import tensorflow as tf

    def loop_fn(iterator, n):
        calls.append((iterator, int(n)))
        return tf.zeros([int(n)]), tf.constant([int(n)])

    return loop_fn


def test_drive_runs_every_step_once_in_epoch_sized_calls():
    calls, iterators, starts, ends, chunks = [], [], [], [], []

    def make_iterator(start):
        iterators.append(start)
        return "it"

    def on_loop(chunk):
        chunks.append((chunk.epoch, chunk.position, chunk.first_step, chunk.steps, chunk.last_step))
        assert chunk.outputs[0].shape == (chunk.steps,) and chunk.seconds >= 0

    reached = loop.drive(_fake_loop(calls), make_iterator, start=7, total=23, steps_per_epoch=10, steps_per_loop=4,
                         every=5, on_loop=on_loop, on_epoch_start=lambda e, pos: starts.append((e, pos)),
                         on_epoch_end=lambda e, s, complete, stopped: ends.append((e, s, complete, stopped)))
    assert reached == 23
    assert iterators == [7]  # one iterator for the whole drive, from the step it resumes at
    assert starts == [(0, 7), (1, 0), (2, 0)]  # a resumed run enters epoch 0 at position 7
    assert [c[3] for c in chunks] == [3, 4, 1, 4, 1, 3]  # 7-10 | 10-14, 14-15 (checkpoint at 15), 15-19, 19-20 | 20-23
    assert sum(c[3] for c in chunks) == 16 and all(c[2] + c[3] == c[4] for c in chunks)
    assert ends == [(0, 10, True, False), (1, 20, True, False), (2, 23, False, False)]
    assert [it for it, _ in calls] == ["it"] * 6


def test_a_hook_stops_the_drive_after_its_epoch_end():
    ends = []
    reached = loop.drive(_fake_loop([]), lambda start: None, start=0, total=100, steps_per_epoch=10, steps_per_loop=4,
                         on_loop=lambda chunk: chunk.last_step >= 6,
                         on_epoch_end=lambda e, s, complete, stopped: ends.append((e, s, complete, stopped)))
    assert reached == 8 and ends == [(0, 8, False, True)]


def test_nothing_to_do():
    calls = []
    assert loop.drive(_fake_loop(calls), lambda start: None, start=30, total=30, steps_per_epoch=10,
                      steps_per_loop=4) == 30
    assert calls == []


def test_calls_counts_drive_s_cuts_ahead():
    # 16 steps in epochs of 16, 10 per call: 10 + 6; across epochs of 5: 5+5+5+1; a checkpoint every 4 cuts too.
    assert loop.calls(0, 16, 16, 10) == 2
    assert loop.calls(0, 16, 5, 10) == 4
    assert loop.calls(0, 16, 16, 10, every=4) == 4
    assert loop.calls(16, 16, 16, 10) == 0


@pytest.mark.parametrize("warmup, per_call, n_calls, warm", [
    (10, 10, 5, 1), (10, 4, 5, 3),    # the warm-up fits: it is kept
    (10, 4, 3, 1), (20, 10, 2, 1),    # it would cover every call: two stay timed, or one of two
    (40, 10, 4, 2), (0, 10, 1, 1),    # never less than the first call, which traces the step
])
def test_a_run_shorter_than_its_timing_warm_up_still_times_its_last_calls(warmup, per_call, n_calls, warm):
    # Failed before the fix: a strong-scaling run of 2 calls with a 10-step warm-up in calls of 10 timed nothing
    # (images/sec NaN beside status ok).
    assert loop.warm_calls(warmup, per_call, n_calls) == warm
