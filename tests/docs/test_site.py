"""The documentation site builds strictly from a clean tree, has every page, shows the reference generated from the
code, and renders in a real browser with its images.

The build here is ``make docs``' build with one difference, chosen to keep the suite's cost near a minute: ``make
docs`` executes every notebook in smoke mode first (minutes on 2 cores), the suite executes only the cheapest one
(00_environment, as its own first cell says) and renders the others as committed, without outputs. The notebook
pages are rendered the same way either way, and the browser checks the executed one's figures.
"""

import html
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tftoolkit import cli, summary
from tftoolkit.config import cli_fields

from helpers import ROOT, executed_notebook

pytestmark = pytest.mark.slow

EXECUTED = "00_environment"


def _mkdocs(*args, cwd=ROOT, env_extra=None, timeout=600):
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; make test installs it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    work = tmp_path_factory.mktemp("docs")
    # The session's one smoke run of it, which tests/experiments/test_notebooks.py checks too
    notebook, _ = executed_notebook(EXECUTED, tmp_path_factory.getbasetemp())
    out = work / "site"
    built = _mkdocs("--site-dir", str(out), env_extra={"TFTOOLKIT_DOCS_EXECUTED": str(notebook.parent.parent)})
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


def test_every_page_is_built(site):
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"]
    listed = re.findall(r"[\w/.-]+\.(?:md|ipynb)", str(nav))
    pages = {*listed, "index.md", "benchmarks/index.md",
             *(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")),
             *(f"benchmarks/{p.name}" for p in (ROOT / "docs" / "benchmarks").glob("*.md"))}
    for page in pages:
        assert (site / re.sub(r"\.(md|ipynb)$", ".html", page)).exists(), page
    for guide in ("data", "measuring", "batch-science", "multi-worker", "data-service", "reliability", "planner"):
        assert (site / "guides" / f"{guide}.html").exists(), guide
    assert (site / "images" / "scaling.png").exists() and (site / "images" / "breakdown.png").exists()


def test_the_reference_is_generated_from_the_code(site):
    cli_text = _text(site / "reference" / "cli.html")
    for path in ("train", "scale", "sweep", "bench input", "data-service start", "predict", "advise", "launch"):
        assert f"tftoolkit {path}" in cli_text, path
    parser = cli.build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        for option in action.option_strings:
            assert option in cli_text, option
    config_text = _text(site / "reference" / "config.html")
    for f in cli_fields():
        assert f.name in config_text and "--" + f.name.replace("_", "-") in config_text, f.name
    summary_text = _text(site / "reference" / "summary.html")
    for name, field in summary.FIELDS.items():
        assert name in summary_text, name
    hardware = _text(site / "reference" / "hardware.html")
    from tftoolkit import catalogue

    for entry in (*catalogue.gpus(), *catalogue.links(), *catalogue.systems()):
        assert entry.key in hardware, entry.key
    assert "H100" in hardware and "https://" in hardware  # the NVML names and the sources
    api = _text(site / "reference" / "api.html")
    assert "RunRecorder" in api and "init_devices" in api and "ToolkitError" in api
    design = _text(site / "design.html")
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]:
        assert c["name"] in design, c["name"]


def test_the_home_page_is_the_readme_and_benchmarks_open_with_the_headline_table(site):
    home = _text(site / "index.html")
    assert "How fast does my TensorFlow model train on N GPUs" in home and "CPU-simulated" in home
    assert 'src="images/scaling.png"' in (site / "index.html").read_text()
    bench = (site / "benchmarks" / "index.html").read_text()
    assert "claim" in bench and "machine" in bench and 'href="recipes.html"' in bench


def test_a_broken_link_fails_the_build_under_the_site_s_settings(tmp_path):
    """The same strictness settings (strict, validation) on a one-page site that links to a page that is not there."""
    settings = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guides/missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({"site_name": "t", "strict": True,
                                                          "validation": settings["validation"]}))
    built = _mkdocs(cwd=tmp_path)
    assert built.returncode != 0 and "guides/missing.md" in built.stdout + built.stderr


def _images(browser) -> list:
    browser.wait_for("Array.from(document.images).every(i => i.complete)")
    return browser.evaluate("Array.from(document.images).map(i => [i.naturalWidth, i.naturalHeight, i.alt])")


def test_the_index_the_design_page_and_a_notebook_page_render_with_their_images_in_a_real_browser(site, chromium):
    chromium.open((site / "index.html").as_uri())
    images = [i for i in _images(chromium) if i[2]]  # the README's figure (the theme's logo has no alt text)
    assert len(images) >= 2 and all(w > 100 and h > 100 for w, h, _ in images), images
    nav = chromium.evaluate("Array.from(document.querySelectorAll('.md-nav__link')).map(a => a.innerText.trim())")
    for section in ("Getting started", "Common tasks", "Notebooks", "Guides", "Reference", "Design", "Benchmarks"):
        assert section in nav, (section, nav)
    chromium.open((site / "design.html").as_uri())
    diagram = [(w, h) for w, h, alt in _images(chromium) if alt.startswith("parameters go into a RunConfig")]
    assert diagram and all(w > 500 and h > 400 for w, h in diagram), diagram  # docs/images/design.svg, 780 x 594
    chromium.open((site / "notebooks" / f"{EXECUTED}.html").as_uri())
    figures = [(w, h) for w, h, _ in _images(chromium) if w > 100 and h > 100]
    assert len(figures) >= 2, figures  # the notebook's two figures, embedded by the executed copy
    cells = chromium.evaluate("document.querySelectorAll('.jp-Cell, .cell').length")
    assert cells >= 4
    text = chromium.evaluate("document.body.innerText")
    assert "Traceback" not in text and "absl::InitializeLog" not in text  # TensorFlow's start-up lines dropped
