"""tftoolkit.errors: the line an exhausted memory gets, in the CLI and in summary.json's error."""

import resource

import pytest

from tftoolkit.errors import error_line, out_of_memory


class ResourceExhaustedError(Exception):  # named as TensorFlow's: matched by name, without importing TensorFlow
    pass


def test_a_run_that_ran_out_of_memory_records_what_ran_out_and_what_to_lower(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda what: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    line = error_line(MemoryError())
    assert line.startswith("out of host memory (MemoryError, no size given); lower what the run holds: the batch")
    assert "ulimit" not in line  # no address-space limit to name
    tf_line = error_line(ResourceExhaustedError("OOM when allocating tensor with shape[64,512,512,64] on /gpu:0\nmore"))
    assert tf_line.startswith("out of memory (ResourceExhaustedError: OOM when allocating tensor with shape"
                              "[64,512,512,64] on /gpu:0); lower") and "\n" not in tf_line
    assert out_of_memory(ValueError("not memory")) is None
    assert error_line(ValueError("x")) == "ValueError: x"
