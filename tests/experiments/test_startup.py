"""experiments.startup: the toolkit's own processes skip jsonschema's slow optional format checkers, and notebooks
still validate; importing tftoolkit changes nothing."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import tftoolkit, tftoolkit.experiments, tftoolkit.cli
assert "rfc3987_syntax" not in sys.modules, "importing tftoolkit must leave sys.modules alone"
from tftoolkit.experiments.startup import skip_slow_format_checkers
skip_slow_format_checkers()
import jsonschema, nbformat, papermill
assert sys.modules["rfc3987_syntax"] is None
checkers = jsonschema.FormatChecker().checkers
assert "iri" not in checkers and "iri-reference" not in checkers
assert {"email", "ipv4", "date", "uri"} <= set(checkers), sorted(checkers)  # the others are all there
nb = nbformat.read(sys.argv[1], as_version=4)
nbformat.validate(nb)  # a real notebook still validates
nb.cells[0]["cell_type"] = "no-such-type"
try:
    nbformat.validate(nb)
except nbformat.ValidationError:
    pass
else:
    raise AssertionError("a broken notebook validated")
print("ok")
"""


@pytest.mark.slow
def test_entry_points_skip_the_iri_checkers_and_notebooks_still_validate():
    done = subprocess.run([sys.executable, "-c", CHECK, str(ROOT / "notebooks" / "00_environment.ipynb")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
