"""docs/hooks/reference.py's generated pages, built in milliseconds from the code (the site's build is test_site)."""

import sys

import pytest

from helpers import ROOT

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]'; make test installs it)")
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import reference  # noqa: E402  (docs/hooks is not a package: mkdocs loads it as a hook)


def test_the_cli_reference_gives_train_s_defaults_in_their_column():
    # Failed before the fix: RunConfig's options are SUPPRESS in argparse, so the column was empty for all of them.
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in reference.cli_page().splitlines()
            if line.startswith("| `--")}
    assert rows["`--steps-per-loop` `INT`"] == "`10`"
    assert rows["`--model` `STR`"] == "`small_vgg`"
    assert rows["`--replicas` `INT`"] == ""  # None: decided at run time, as its help says


def test_a_link_to_a_file_the_site_shows_becomes_the_link_to_its_page():
    page = "[a](../../BENCHMARKS.md) [b](../../tftoolkit/summary.py) [c](../training.md) [d](../../docs/benchmarks/)"
    assert reference.site_links(page, "docs/guides/x.md", "guides/x.md") == (
        "[a](../benchmarks/index.md) [b](../reference/summary.md) [c](../training.md) [d](../benchmarks/index.md)")
    assert "](benchmarks/index.md)" in reference.site_copy("README.md", "index.md")


def test_the_benchmarks_nav_holds_the_users_topics_and_developers_get_their_own():
    # Failed before the fix: 20 topics under Benchmarks, the test suite's time and refactors among them.
    import yaml

    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"]
    reference.on_config({"nav": nav, "docs_dir": str(ROOT / "docs")})
    sections = {k: v for entry in nav if isinstance(entry, dict) for k, v in entry.items()}
    users, developers = sections["Benchmarks"], sections["Developers"]
    assert "benchmarks/suite-time.md" in developers and "benchmarks/house.md" in developers
    assert "benchmarks/planner.md" in users and "benchmarks/recipes.md" in users
    topics = {f"benchmarks/{p.name}" for p in (ROOT / "docs" / "benchmarks").glob("*.md")}
    assert set(users[1:]) | set(developers[1:]) == topics and not set(users) & set(developers)
