"""The validation table's FLOPs are the toolkit's own count of the Keras model (slow: builds ResNet-50)."""

import pytest

from tftoolkit.science import modelsize, validation


@pytest.mark.slow
def test_resnet50_count_matches_the_validation_table():
    params, forward, how = modelsize.count("resnet50", 224)
    assert params == validation.PARAMS["resnet50"]
    assert forward / 1e9 == pytest.approx(validation.FORWARD_GFLOPS["resnet50"], rel=1e-3)
