"""tftoolkit.nvml: the one way into NVML. Sessions nest and shut NVML down once; nothing else imports pynvml."""

import ast

import pytest

import fake_nvml
from tftoolkit import nvml

from helpers import ROOT


def test_nested_sessions_initialise_and_shut_down_nvml_once(monkeypatch):
    mod = fake_nvml.install(monkeypatch)
    with nvml.session() as outer:
        with nvml.session() as inner:
            assert inner is outer is mod and nvml.open_sessions() == 2
            assert inner.nvmlDeviceGetCount() == 4
        assert mod._initialised == 1 and outer.nvmlDeviceGetCount() == 4  # still open for the outer block
    assert mod.calls["nvmlInit"] == 1 and mod.calls["nvmlShutdown"] == 1
    assert mod._initialised == 0 and nvml.open_sessions() == 0


def test_a_block_that_raises_still_shuts_nvml_down_once(monkeypatch):
    mod = fake_nvml.install(monkeypatch)
    with pytest.raises(ZeroDivisionError):
        with nvml.session():
            with nvml.session():
                1 / 0
    assert mod.calls["nvmlShutdown"] == 1 and mod._initialised == 0 and nvml.open_sessions() == 0
    with nvml.session() as again:  # and the next session opens afresh
        assert again.nvmlDeviceGetCount() == 4
    assert mod.calls["nvmlInit"] == 2 and mod.calls["nvmlShutdown"] == 2


def test_a_failed_init_leaves_no_session_open(monkeypatch):
    mod = fake_nvml.install(monkeypatch, init_error="NVMLError_DriverNotLoaded")
    with pytest.raises(mod.NVMLError_DriverNotLoaded):
        with nvml.session():
            pass
    assert nvml.open_sessions() == 0 and mod.calls.get("nvmlShutdown", 0) == 0


def _imports_pynvml(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pynvml" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pynvml":
            return True
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and any(isinstance(a, ast.Constant) and a.value == "pynvml"
                                                       for a in node.args):
            return True
    return False


def test_only_the_leaf_module_imports_pynvml():
    found = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tftoolkit").rglob("*.py")
                   if _imports_pynvml(ast.parse(p.read_text())))
    assert found == ["tftoolkit/nvml.py"]


def test_the_scan_sees_every_way_of_importing_it():
    for code in ("import pynvml", "from pynvml import nvmlInit", "import pynvml as p",
                 "importlib.import_module('pynvml')", "def f():\n    import pynvml"):
        assert _imports_pynvml(ast.parse(code)), code
    assert not _imports_pynvml(ast.parse("from . import nvml\nnvml.session()"))
