"""tftoolkit.engine.step: what the engine does to TensorFlow's logging (the step itself is tested by the trainings)."""

import logging

from tftoolkit.engine import step

RETRACING = ("6 out of the last 11 calls to <function {} at 0x7f3c8ddf0900> triggered tf.function retracing. "
             "Tracing is expensive and the excessive number of tracings could be due to (1) creating @tf.function "
             "repeatedly in a loop, ...")


def _kept(message: str) -> bool:
    record = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1, message, None, None)
    return step.PerRunTracing().filter(record)


def test_each_run_s_own_functions_are_no_retracing_warning_but_a_real_retrace_still_is():
    # Failed before the fix: a grid of 12 small runs in one process (notebook 02's shape) logged "triggered
    # tf.function retracing" for build_engine.<locals>.train_loop and .evaluate from the sixth run on.
    assert not _kept(RETRACING.format("build_engine.<locals>.train_loop"))
    assert not _kept(RETRACING.format("build_engine.<locals>.evaluate"))
    # the functions build_engine's helpers make for each run (engine/step.py's BUILDERS)
    for name in ("make_train_loop.<locals>.train_loop", "replica_functions.<locals>.replica_step",
                 "make_evaluate.<locals>.evaluate"):
        assert not _kept(RETRACING.format(name)), name
    assert _kept(RETRACING.format("my_step"))  # a user's function that retraces: still said
    assert _kept("some other TensorFlow warning about build_engine.<locals>.train_loop")


def test_the_filter_is_installed_once():
    tf_log = logging.getLogger("tensorflow")
    step.quiet_per_run_tracing()
    step.quiet_per_run_tracing()
    assert sum(isinstance(f, step.PerRunTracing) for f in tf_log.filters) == 1
