"""Start-up of the processes the toolkit itself starts (the ``tftoolkit`` command, each sweep point and Slurm task).

nbformat validates notebooks with jsonschema, and jsonschema's non-GPL format checkers import ``rfc3987-syntax``
(installed with JupyterLab, through jupyter-events' ``jsonschema[format-nongpl]``), which compiles three Earley
parsers when it is imported: ~1.2 s of CPU in every process that imports papermill or nbformat (BENCHMARKS.md),
reported upstream as python-jsonschema/jsonschema#1428. Those parsers check the "iri" and "iri-reference" string formats only;
nbformat and papermill validate without a format checker, so nothing in these processes uses them. Marking the
module absent makes jsonschema skip those two checkers, as it does where the package is not installed.

Only entry points call this: importing tftoolkit in a user's own process (a notebook, a script) changes nothing.
"""

from __future__ import annotations

import sys

SLOW_OPTIONAL = "rfc3987_syntax"


def skip_slow_format_checkers() -> None:
    # None in sys.modules makes `import rfc3987_syntax` raise ImportError, which jsonschema treats as absent.
    # A process that already imported it keeps it.
    sys.modules.setdefault(SLOW_OPTIONAL, None)
