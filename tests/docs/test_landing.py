"""README.md is a landing page and BENCHMARKS.md opens with its headline table."""

import itertools
import re

from helpers import ROOT


def test_readme_is_a_landing_page_with_a_cpu_simulated_figure():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 15_000
    images = re.findall(r'<img src="([^"]+)"', readme)
    assert len(images) == 2
    for src in images:
        png = ROOT / src
        assert png.suffix == ".png" and png.exists() and png.stat().st_size < 100_000, src
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "CPU-simulated" in readme
    for must in ("make demo", "make test", "| notebook | what it answers |", "```python", "docs/tasks.md"):
        assert must in readme, must


def test_benchmarks_open_with_the_headline_table():
    head = (ROOT / "BENCHMARKS.md").read_text().splitlines()[:40]
    header = next(i for i, line in enumerate(head) if line.startswith("| claim |"))
    assert [c.strip() for c in head[header].strip("|").split("|")] == ["claim", "figure", "target", "machine",
                                                                     "date (UTC)", "command"]
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), head[header + 2:]))  # the table's own rows
    assert len(rows) >= 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 6 and all(cells), row
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", cells[4]), row
