"""The planner against the published tables: every row's published and forecast rate, the error and the interval.

    python benchmarks/planner_validation.py            validation/published.csv (what the planner is fitted to)
    python benchmarks/planner_validation.py heldout    validation/heldout.csv (kept back, checks only)

docs/benchmarks/planner.md holds its output.
"""

import sys

from tftoolkit.science import validation

if __name__ == "__main__":
    path = validation.HELDOUT if sys.argv[1:] == ["heldout"] else validation.PUBLISHED
    print(validation.table(validation.residuals(validation.read(path), validation.release()["fractions"])))
