"""A sweep spec: one notebook and a parameter grid, checked against the notebook before anything runs.

    notebook: ../notebooks/01_data_parallel_scaling.ipynb    # relative to the spec file
    report: ../notebooks/04_report.ipynb                     # optional (this is the default); null = no report
    fixed:                                                   # the same in every point
      smoke: false
    grid:                                                    # crossed: every combination
      replicas: [1, 2, 4]
      model: [small_cnn, resnet20]
    zip:                                                     # paired: the i-th values go together
      per_replica_batch: [128, 64]
      base_lr: [0.1, 0.05]

Points are grid (Cartesian product, keys in the order written) x zip (rows): 3 x 2 x 2 = 12 above.

Every value is checked against the parameter the notebook declares in its ``parameters`` cell (read with
papermill's ``inspect_notebook``): the name must exist, and the value must have the declared type (or the
default's type where there is no annotation). An int is a fine float. A single value for a parameter declared
as ``list`` runs that point with a one-element list: ``grid: {replicas: [1, 2, 4]}`` on a notebook taking
``replicas: list`` gives three points, each with one replica count (``[1]``, ``[2]``, ``[4]``).
Each point has its folder, ``SWEEP_DIR/runs/<id>/``. A notebook that declares ``out_dir`` gets that folder as
``out_dir`` (the sweep's to set); any other parameterised notebook runs with that folder as its working
directory, so what it writes (figures, CSVs) lands there. A ``results.json`` the notebook leaves in its folder (a
JSON object of numbers and strings) becomes columns of results.csv.
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ...errors import SweepError

SPEC_KEYS = ("notebook", "report", "fixed", "grid", "zip", "description")
OUT_PARAM = "out_dir"
REPORT_PARAMS = ("sweep_dirs", OUT_PARAM)
MAX_ID_CHARS = 80


@dataclass(frozen=True)
class Point:
    """One papermill run. ``params`` is what the spec says (for the results table); ``inject`` is what the
    notebook receives (single values for list parameters wrapped in a list)."""

    index: int
    id: str
    params: dict
    inject: dict


@dataclass
class Spec:
    notebook: Path
    report: Path | None
    fixed: dict
    grid: dict
    zip: dict
    declared: dict           # name -> papermill's {name, inferred_type_name, default, help}
    points: list[Point] = field(default_factory=list)
    source: str = "<dict>"
    description: str = ""

    @property
    def takes_out_dir(self) -> bool:
        """Whether the notebook declares ``out_dir`` (else each point runs in its folder as working directory)."""
        return OUT_PARAM in self.declared

    def identity(self) -> dict:
        """What makes two sweeps the same sweep: the notebook and the exact points."""
        return {"notebook": self.notebook.name, "points": [{"id": p.id, "params": p.params} for p in self.points]}


def default_report() -> Path:
    """The repository's 04_report notebook (next to the package in a clone)."""
    return Path(__file__).resolve().parents[2] / "notebooks" / "04_report.ipynb"


# --- loading -------------------------------------------------------------------------------------------
def _unique_keys_loader():
    """yaml.SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last, silently)."""
    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (also on line {seen[key]}); keep one of them",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:
                continue  # an unhashable key: SafeLoader's own error says so
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return UniqueKeyLoader


def load(spec, base_dir: str | Path | None = None) -> Spec:
    """Read and validate a spec (a YAML path, or a dict with paths relative to ``base_dir``)."""
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_file():
            raise SweepError(f"sweep spec {path} not found")
        try:
            raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_keys_loader())  # noqa: S506 - a SafeLoader
            json.dumps(raw, default=str)  # a value that contains itself (an anchor used inside its own node)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise SweepError(f"{path} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
        except UnicodeDecodeError as e:
            raise SweepError(f"{path} is not UTF-8 text (byte {e.start}); save the spec as UTF-8") from None
        except (ValueError, RecursionError):
            raise SweepError(f"{path}: a value contains itself (a YAML anchor used inside its own node); write the "
                             "values out") from None
        source, base = str(path), path.resolve().parent
    else:
        raw, source, base = spec, "<dict>", Path(base_dir or ".").resolve()
    if not isinstance(raw, dict):
        raise SweepError(f"{source}: a sweep spec is a mapping with keys {', '.join(SPEC_KEYS)}")
    unknown = [k for k in raw if k not in SPEC_KEYS]
    if unknown:
        raise SweepError(f"{source}: unknown key(s) {', '.join(map(str, unknown))}; a spec has {', '.join(SPEC_KEYS)}")
    if not raw.get("notebook"):
        raise SweepError(f"{source}: no 'notebook:' given; name the notebook to run (path relative to the spec)")

    notebook = _resolve(base, raw["notebook"], "notebook", source)
    report = _resolve(base, raw["report"], "report", source) if raw.get("report") else None
    if "report" not in raw:
        report = default_report() if default_report().is_file() else None

    sections = {}
    for key in ("fixed", "grid", "zip"):
        value = raw.get(key) or {}
        if not isinstance(value, dict):
            raise SweepError(f"{source}: '{key}:' must map parameter names to values, got {type(value).__name__}")
        sections[key] = {str(k): v for k, v in value.items()}
    fixed, grid, zipped = sections["fixed"], sections["grid"], sections["zip"]
    for a, b in (("fixed", "grid"), ("fixed", "zip"), ("grid", "zip")):
        both = sorted(set(sections[a]) & set(sections[b]))
        if both:
            raise SweepError(f"{source}: {', '.join(both)} given in both '{a}:' and '{b}:'; keep each parameter in one")
    if not grid and not zipped:
        raise SweepError(f"{source}: empty grid: give at least one parameter under 'grid:' or 'zip:' to sweep over")
    for key, section in (("grid", grid), ("zip", zipped)):
        for name, values in section.items():
            if not isinstance(values, list):
                raise SweepError(f"{source}: {key}.{name} must be a list of values, got {_show(values)}")
            if not values:
                raise SweepError(f"{source}: empty grid: {key}.{name} has no values")
    lengths = {name: len(v) for name, v in zipped.items()}
    if len(set(lengths.values())) > 1:
        raise SweepError(f"{source}: 'zip:' lists must have equal lengths, got "
                         + ", ".join(f"{k}={n}" for k, n in lengths.items()))
    names = list(fixed) + list(grid) + list(zipped)
    if OUT_PARAM in names:
        raise SweepError(f"{source}: {OUT_PARAM} is set by the sweep (each point writes into SWEEP_DIR/runs/<id>/); "
                         "remove it from the spec")

    declared = declared_parameters(notebook)
    undeclared = [n for n in names if n not in declared]
    if undeclared:
        raise SweepError(f"{source}: parameter(s) {', '.join(undeclared)} not declared in {notebook.name}'s parameters "
                         f"cell; it declares {', '.join(declared)}")
    if report is not None:
        rdecl = declared_parameters(report)
        missing = [p for p in REPORT_PARAMS if p not in rdecl]
        if missing:
            raise SweepError(f"report notebook {report} lacks parameter(s) {', '.join(missing)}; set 'report: null' or "
                             "give a notebook that takes sweep_dirs and out_dir")

    spec = Spec(notebook, report, fixed, grid, zipped, declared, source=source,
                description=str(raw.get("description") or ""))
    spec.points = expand(spec)
    return spec


def _resolve(base: Path, value, what: str, source: str) -> Path:
    path = Path(str(value)).expanduser()
    path = path if path.is_absolute() else (base / path)
    if not path.is_file():
        raise SweepError(f"{source}: {what} {value} not found (looked for {path}; paths are relative to the spec file)")
    if path.suffix != ".ipynb":
        raise SweepError(f"{source}: {what} {value} is not a notebook (.ipynb)")
    return path.resolve()


def declared_parameters(notebook: Path) -> dict:
    """The notebook's parameters as papermill infers them from the cell tagged ``parameters``."""
    # Deferred: papermill and nbformat take about a second to import (startup.py); only checking a spec against its
    # notebook needs them, and grid (in notebook 02's kernel) imports this module for combinations and slug.
    import nbformat
    import papermill

    try:
        nb = nbformat.read(str(notebook), as_version=4)
    except Exception as e:  # noqa: BLE001 - a broken notebook file is the user's to fix
        raise SweepError(f"{notebook} is not a readable notebook: {type(e).__name__}: {e}") from None
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        raise SweepError(f"{notebook} has no cell tagged 'parameters'; tag the cell holding its defaults "
                         "(papermill injects the sweep's values after it)")
    logging.getLogger("papermill").setLevel(logging.WARNING)
    return papermill.inspect_notebook(str(notebook))


# --- expansion -----------------------------------------------------------------------------------------
def combinations(grid: dict, zipped: dict, fixed: dict | None = None) -> list[dict]:
    """grid crossed (keys in order) x zip paired, each with ``fixed`` added: the points' parameters."""
    fixed = fixed or {}
    rows = [dict(zip(zipped, vals)) for vals in zip(*zipped.values())] if zipped else [{}]
    out = []
    for combo in itertools.product(*grid.values()) if grid else [()]:
        for row in rows:
            out.append({**fixed, **dict(zip(grid, combo)), **row})
    return out


def expand(spec: Spec) -> list[Point]:
    combos = combinations(spec.grid, spec.zip, spec.fixed)
    keys = list(spec.grid) + list(spec.zip)
    varying = [k for k in keys if len({_key(c[k]) for c in combos}) > 1]
    width = max(2, len(str(len(combos) - 1)))
    points = []
    for i, params in enumerate(combos):
        inject = {name: check_value(name, value, spec.declared[name], spec.source) for name, value in params.items()}
        label = "_".join(f"{k}-{slug(params[k])}" for k in varying)
        pid = f"{i:0{width}d}" + (f"_{label}" if label else "")
        points.append(Point(i, pid[:MAX_ID_CHARS].rstrip("_-"), params, inject))
    return points


def _key(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def slug(value) -> str:
    """A value as a file-name-safe piece of a point id: [1, 2] -> '1+2', 0.001 -> '0.001'."""
    if isinstance(value, (list, tuple)):
        return "+".join(slug(v) for v in value) or "empty"
    if isinstance(value, float):
        text = f"{value:g}"
    elif value is None:
        text = "none"
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9.+]+", "-", text).strip("-") or "x"


# --- types ---------------------------------------------------------------------------------------------
_TYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "dict": dict, "tuple": list,
               "none": type(None), "nonetype": type(None)}


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def parse_type(type_name: str | None, default_text: str | None) -> tuple[set | None, type | None]:
    """(allowed base types or None for any, list element type or None) from papermill's inspection."""
    allowed: set = set()
    elem = None
    name = (type_name or "").strip()
    if name and name not in ("None", "Any", "typing.Any"):
        m = re.fullmatch(r"(?:typing\.)?Optional\[(.*)\]", name)
        if m:
            name = m.group(1) + " | None"
        for part in _split_top(name, "|"):
            part = part.strip()
            base, _, inner = part.partition("[")
            base = base.strip().split(".")[-1].lower()
            if base not in _TYPE_NAMES:
                return None, None  # a type we do not know: do not second-guess it
            allowed.add(_TYPE_NAMES[base])
            if base == "list" and inner:
                elem = _TYPE_NAMES.get(inner.rstrip("]").strip().lower())
    default = _literal(default_text)
    if not allowed:
        if default is _UNKNOWN or default is None:
            return None, None
        allowed.add(type(default) if type(default) is not tuple else list)
    if list in allowed and elem is None and isinstance(default, list) and default:
        kinds = {type(v) for v in default}
        if len(kinds) == 1:
            elem = kinds.pop()
        elif kinds <= {int, float}:
            elem = float
    if default is None:
        allowed.add(type(None))
    return allowed, elem


_UNKNOWN = object()


def _literal(text):
    if text is None:
        return _UNKNOWN
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return _UNKNOWN


def _fits(value, tp) -> bool:
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _show(value) -> str:
    return f"{type(value).__name__} {value!r}"


def check_value(name: str, value, declared: dict, source: str = "spec"):
    """The value to inject for ``name``, or a SweepError when its type does not fit the notebook's declaration."""
    allowed, elem = parse_type(declared.get("inferred_type_name"), declared.get("default"))
    if allowed is None:
        return value
    want = " or ".join(sorted("None" if t is type(None) else t.__name__ for t in allowed))
    if value is None:
        if type(None) in allowed:
            return None
        raise SweepError(f"{source}: {name} = None, but the notebook declares {name}: {want}")
    for tp in (bool, int, float, str, dict, list):
        if tp in allowed and _fits(value, tp):
            if tp is float:
                return float(value)
            if tp is list and elem is not None:
                bad = [v for v in value if not _fits(v, elem)]
                if bad:
                    raise SweepError(f"{source}: {name} = {value!r}: items must be {elem.__name__}, got {_show(bad[0])}")
                return [float(v) if elem is float else v for v in value]
            return value
    if list in allowed and not isinstance(value, (list, dict)) and (elem is None or _fits(value, elem)):
        return [float(value) if elem is float else value]  # one value for a list parameter: a one-element list
    hint = ""
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+(\.\d*)?[eE][+-]?\d+", value) and float in (allowed | {elem}):
        hint = f" (YAML reads {value} as text; write it with a dot, like {float(value):.1e})"
    raise SweepError(f"{source}: {name} = {value!r} is {type(value).__name__}, but the notebook declares "
                     f"{name}: {want}" + (f" of {elem.__name__}" if list in allowed and elem else "") + hint)


def point_label(point: Point) -> str:
    """A point's parameters as a sentence names them: "replicas=2, model='small_cnn'"."""
    return ", ".join(f"{k}={v!r}" for k, v in point.params.items())


__all__ = ["Spec", "Point", "load", "expand", "combinations", "check_value", "parse_type", "declared_parameters",
           "default_report", "point_label", "slug"]
