"""The package's layout: import-linter's layering contracts hold, and they would catch a violation; no module
imports another module's private names; few plain modules at the top; cli is the only place that prints."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "tftoolkit"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.exists():
        pytest.skip(f"lint-imports is not installed next to {sys.executable} (pip install -e '.[dev]')")
    env = {"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(cwd), "HOME": str(cwd)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_layering_contracts_hold():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("module, line, contract", [
    ("engine/devices.py", "from ..cli import main", "Each layer imports only the layers below it"),
    ("experiments/report/results.py", "import tensorflow", "File readers never import TensorFlow"),
    ("data/source.py", "from ..training import train", "engine and data never import"),
])
def test_a_violation_breaks_a_contract(tmp_path, module, line, contract):
    copy = tmp_path / "repo"
    shutil.copytree(PACKAGE, copy / "tftoolkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "tftoolkit" / module
    target.write_text(target.read_text() + f"\n\ndef _violation():\n    {line}\n")
    done = _lint(copy)
    assert done.returncode != 0
    broken = done.stdout[done.stdout.index("Broken contracts"):]
    assert contract in broken


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def test_no_module_imports_another_modules_private_names():
    offences = []
    for module, path in _modules():
        tree = ast.parse(path.read_text())
        imported_modules = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(module, path, node)
                if not source.startswith("tftoolkit"):
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {source} import {alias.name}")
                    imported_modules[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tftoolkit"):
                        imported_modules[alias.asname or alias.name.split(".")[0]] = alias.name
        for node in ast.walk(tree):
            # module._private: reaching into another module's internals through its name
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in imported_modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not offences, "private names used across modules:\n" + "\n".join(offences)


def test_every_import_of_the_package_resolves_lazy_ones_included():
    # import-linter skips an import of a module that does not exist, and a lazy import inside a function fails
    # only when that function runs (a `from .data import ...` in experiments/ once broke `make demo` only).
    import importlib.util

    missing = []
    for module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(module, path, node)
                if not source.startswith("tftoolkit"):
                    continue
                if importlib.util.find_spec(source) is None:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {source} import ...")
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    mod = importlib.import_module(source)
                    if not hasattr(mod, alias.name) and importlib.util.find_spec(sub) is None:
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} not in {source}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tftoolkit") and importlib.util.find_spec(alias.name) is None:
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {alias.name}")
    assert not missing, "imports that cannot resolve:\n" + "\n".join(missing)


def test_few_plain_modules_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    # The layers' floor: errors, fileio, gpus, logs, noise_scale, nvml (the one way into NVML, below gpus),
    # rundir and summary (and the config, a room of two: RunConfig and the rules its values meet); anything else
    # belongs in a room.
    assert len(top) <= 9, top
    subpackages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert subpackages == ["catalogue", "cli", "cluster", "config", "data", "engine", "experiments", "measure", "planner",
                           "plots", "training", "tuning"]


def test_modules_stay_small_enough_to_have_one_job():
    # A module past a few hundred lines is asking to be split along a seam: none over 500, at most four over 400.
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert not [m for m, n in lines.items() if n > 500], sorted((n, m) for m, n in lines.items() if n > 500)
    over_400 = sorted((n, m) for m, n in lines.items() if n > 400)
    assert len(over_400) <= 4, over_400


def test_only_the_cli_prints():
    offences = []
    for module, path in _modules():
        if module.startswith("tftoolkit.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offences, "print() outside tftoolkit/cli: " + ", ".join(offences)


def test_every_test_the_reliability_page_s_table_names_exists():
    page = (ROOT / "docs" / "guides" / "reliability.md").read_text()
    table = page.split("\n| what happens |", 1)[1].split("\n\n", 1)[0]
    named, missing = 0, []
    for row in table.splitlines()[2:]:
        current = None
        for ref in re.findall(r"`([\w/]*\.py)?::(\w+)`", row):
            current = ref[0] or current
            named += 1
            if not re.search(rf"^def {ref[1]}\(", (ROOT / "tests" / current).read_text(), re.M):
                missing.append(f"{current}::{ref[1]}")
    assert named >= 14 and not missing, missing


# A tracker issue by number (the word, a space or hyphen, a number): there is no tracker a reader can open. An issue
# of another project named with its number and "#" can be opened, and is allowed.
TRACKER_ISSUE = re.compile(r"\bissues?[- ]\d+", re.I)
# A file cited from outside the repository: the workplace's shared folder or its absolute paths.
# (Spelt in two parts, so that this line is not itself a citation to the before-stop checks.)
OUTSIDE_PATH = re.compile(r"(?<![\w.-])(?:shared/|/wor" r"k/)[\w./-]*")


def test_no_tracked_file_names_a_tracker_issue_or_cites_a_path_outside_the_repository():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    offences = []  # this file is left out: it spells the patterns
    for name in listed.stdout.split("\0"):
        path = ROOT / name
        if not name or name == "tests/test_layout.py" or not path.is_file() or path.suffix in (".png", ".svg", ".pb", ".gz", ".npz", ".tfrecord"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # a binary file
        for n, line in enumerate(text.splitlines(), 1):
            for m in (*TRACKER_ISSUE.finditer(line), *OUTSIDE_PATH.finditer(line)):
                offences.append(f"{name}:{n}: {m.group(0)}")
    assert not offences, f"{len(offences)} citation(s) a reader cannot follow:\n" + "\n".join(offences)
