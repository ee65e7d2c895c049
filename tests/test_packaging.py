"""Set-up files agree with each other: conda users and pip users get the same dependencies."""

import re
import tomllib

import pytest
import yaml

from helpers import ROOT, assert_no_tensorflow



def _name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_list = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_reqs = {r.strip() for r in pip_list if not r.startswith("-e")}
    assert {_name(r) for r in conda_reqs} == {_name(r) for r in project["dependencies"]}
    # Same version bounds too, not only the same names.
    assert conda_reqs == {r.strip() for r in project["dependencies"]}
    assert any(r.startswith("-e .") for r in pip_list), "environment.yml must install the package itself"
    assert "python=3.11" in env["dependencies"]


def test_gpu_extra_pulls_tensorflow_cuda_build():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("tensorflow[and-cuda]") for r in project["optional-dependencies"]["gpu"])
    assert project["scripts"]["tftoolkit"] == "tftoolkit.cli:run"


def test_ci_runs_make_test_and_readme_shows_both_commands():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


@pytest.mark.slow
def test_importing_the_package_does_not_import_tensorflow():
    assert_no_tensorflow("import tftoolkit, tftoolkit.config, tftoolkit.cli; tftoolkit.cli.build_parser()")


def test_the_docs_tools_are_installed_alike_by_pip_conda_and_make():
    """The site's tools are the `docs` extra; environment.yml and `make test`'s install (the suite builds the site)
    both ask for it, and mkdocs.yml uses only what it brings."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    docs = {_name(r) for r in project["optional-dependencies"]["docs"]}
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocs-jupyter"} <= docs
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_list = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    editable = next(r for r in pip_list if r.startswith("-e ."))
    assert "docs" in re.search(r"\[([\w,]+)\]", editable).group(1).split(",")
    makefile = (ROOT / "Makefile").read_text()
    install = re.search(r'pip install --quiet -e "\.\[([\w,]+)\]"', makefile)
    assert install and "docs" in install.group(1).split(",")
    mkdocs_yml = (ROOT / "mkdocs.yml").read_text()
    assert "name: material" in mkdocs_yml and "- mkdocstrings:" in mkdocs_yml and "- mkdocs-jupyter:" in mkdocs_yml


def _pins(path) -> dict:
    return {_name(line): line.split("==")[1].strip() for line in path.read_text().splitlines()
            if "==" in line and not line.lstrip().startswith("#")}


def test_the_oldest_supported_versions_are_the_floors_and_ci_tests_them():
    """constraints/oldest.txt names the oldest TensorFlow, Keras, NumPy and TensorBoard the package allows: each pin
    satisfies pyproject.toml's requirement and sits on its floor, so pip can keep a server's TensorFlow 2.16 and CI
    (.ci/run, through `make test-oldest`) tests what that server runs."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_name(r): Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    pins = _pins(ROOT / "constraints" / "oldest.txt")
    assert {"tensorflow", "keras", "numpy", "tensorboard"} <= set(pins)
    for name, version in pins.items():
        assert required[name].specifier.contains(version), f"{name}=={version} is outside {required[name]}"
    for name in ("tensorflow", "keras", "numpy", "tensorboard"):
        floor = next(s.version for s in required[name].specifier if s.operator == ">=")
        assert pins[name].split(".")[:2] == floor.split(".")[:2], f"{name}: floor {floor}, oldest tested {pins[name]}"
    assert required["tensorflow"].specifier.contains("2.21.0")  # and the newest still
    gpu = Requirement(project["optional-dependencies"]["gpu"][0])
    assert gpu.specifier == required["tensorflow"].specifier, "the gpu extra allows the same TensorFlow releases"
    assert "make test-oldest" in (ROOT / ".ci" / "run").read_text()
    assert "constraints/oldest.txt" in (ROOT / "Makefile").read_text()
