"""MkDocs hook: the reference pages, generated from the code at build time so they cannot drift from it.

- reference/cli.md: every command and option, walked from tftoolkit.cli.build_parser();
- reference/config.md: RunConfig's fields with their options, defaults and help, in cli/sections.py's sections;
- reference/summary.md: summary.json's fields with units and meanings, from tftoolkit/summary.py's table;
- reference/hardware.md: the hardware catalogue (GPUs, links, systems) with every figure's sources, from
  tftoolkit/catalogue/*.toml (the figures MFU and the planner use);
- index.md and benchmarks/index.md: README.md and BENCHMARKS.md themselves, their links made the site's, so the
  landing page and the headline table exist once;
- design.md's contracts and layout: pyproject.toml's import-linter contracts, where the page says <!-- contracts -->,
  the package's rooms and modules as they are, where it says <!-- layout -->, and
  notebooks/index.md's parameters: each notebook's parameters cell, where it says <!-- notebook-parameters -->;
- notebooks/<name>.ipynb: the notebooks, as committed (no outputs) or, when TFTOOLKIT_DOCS_EXECUTED names a
  folder holding executed copies as notebooks/<name>.ipynb (``make docs`` makes them in smoke mode), those, so the
  pages show their figures.

Nothing is written into docs/: the pages are MkDocs' generated files. The hook runs before mkdocs-jupyter's
on_files (a higher priority), so the notebooks it adds are rendered as pages like any other.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import posixpath
import re
import tomllib
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

from tftoolkit import catalogue, cli, summary
from tftoolkit.catalogue import reader as catalogue_files
from tftoolkit.cli.sections import SECTIONS
from tftoolkit.config import RunConfig, cli_fields, field_types

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)}


def cell(text) -> str:
    """Text safe inside a Markdown table cell."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("*", "\\*").replace("_", "\\_").replace("{", "&#123;").replace("\n", " "))


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser, one-line help) of every command and sub-command, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name, "")
                yield from commands(sub, (*path, name))


def option_rows(group) -> list[str]:
    rows = []
    for a in group._group_actions:
        if a.help == argparse.SUPPRESS or isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
        if a.option_strings and a.nargs != 0 and not isinstance(a, argparse.BooleanOptionalAction):
            value = a.metavar or (a.choices and "{" + ",".join(map(str, a.choices)) + "}") or a.dest.upper()
            names += f" `{value}`"  # in code: attr_list would take {a,b} for attributes
        default = "" if a.default in (None, argparse.SUPPRESS, False) or a.required else f"`{a.default}`"
        if a.default == argparse.SUPPRESS and a.dest in CONFIG_DEFAULTS:
            # RunConfig's options are SUPPRESS in argparse (a run directory's config.json fills what is not given),
            # so their default is RunConfig's: None there means "decided at run time", which the help says.
            value = CONFIG_DEFAULTS[a.dest]
            default = "" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"
        if a.required:
            default = "required"
        rows.append(f"| {names} | {default} | {cell((a.help or '').replace('%%', '%'))} |")
    return rows


def cli_page() -> str:
    parser = cli.build_parser()
    out = ["# Command line", "", "Generated from the argparse parsers (`tftoolkit/cli/`) when the site is built: "
           "what `tftoolkit COMMAND --help` prints, one section per command.", ""]
    for path, p, short in commands(parser):
        if any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
            out += [f"## tftoolkit {' '.join(path)}", "", cell(short), ""]
            continue
        about = p.description or short or ""
        if p.formatter_class is argparse.RawDescriptionHelpFormatter:  # laid out by hand: keep its lines
            about = f"```text\n{about.strip()}\n```"
        else:
            about = cell(about.replace("%%", "%"))
        out += [f"## tftoolkit {' '.join(path)}", "", about, "", "```text", p.format_usage().strip(), "```", ""]
        for group in p._action_groups:
            rows = option_rows(group)
            if rows:
                out += [f"**{group.title}**", "", "| option | default | meaning |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(out)


def config_page() -> str:
    hints = field_types()
    fields = {f.name: f for f in cli_fields()}
    out = ["# RunConfig", "", "Every parameter of a training run, generated from `tftoolkit/config/`'s field metadata "
           "when the site is built. The same names are the train options (`--per-replica-batch`), a notebook's or "
           "a sweep's parameters (`per_replica_batch`) and `tftoolkit.train`'s keyword arguments.", "",
           "::: tftoolkit.config.RunConfig", "    options:", "      members: false", "      show_root_heading: false", ""]
    for title, names in SECTIONS:
        out += [f"## {title}", "", "| field | option | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
        for name in names:
            f = fields[name]
            tp = hints[name].__name__ if isinstance(hints[name], type) else str(hints[name]).replace("typing.", "")
            choices = f.metadata.get("choices")
            help_text = f.metadata["help"] + (f" (one of: {', '.join(choices)})" if choices else "")
            out.append(f"| `{name}` | `--{name.replace('_', '-')}` | {cell(tp)} | `{f.default}` | {cell(help_text)} |")
        out.append("")
    hidden = [f.name for f in dataclasses.fields(RunConfig) if f.name not in fields]
    if hidden:
        out += ["Fields with no option (set by the toolkit): " + ", ".join(f"`{n}`" for n in hidden), ""]
    return "\n".join(out)


def summary_page() -> str:
    out = ["# summary.json", "", "Every field a run writes into `RUN_DIR/summary.json`, generated from "
           "`tftoolkit/summary.py`'s table (the one place they are documented; a run that writes an undocumented "
           "field fails its tests). Units: `s` seconds, `images/s`, `bytes`, `FLOP`, `FLOP/s`, `1` a ratio or "
           "fraction; blank for text, counts and flags. Metrics a run is given appear as `val_<name>` and "
           "`train_<name>`.", ""]
    groups: dict[str, list] = {}
    for f in summary.FIELDS.values():
        groups.setdefault(f.group, []).append(f)
    for group, rows in groups.items():
        out += [f"## {group}", "", "| field | unit | meaning |", "| --- | --- | --- |"]
        out += [f"| `{f.name}` | {cell(f.unit)} | {cell(f.meaning)} |" for f in rows]
        out.append("")
    return "\n".join(out)


def notebook_files() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def extend_nav(nav: list, title: str, pages: list[str]) -> None:
    """Append ``pages`` to the nav section ``title`` (a list of pages), so a new notebook or benchmark topic gets a
    page without editing mkdocs.yml."""
    for entry in nav:
        if isinstance(entry, dict) and title in entry:
            entry[title] = list(entry[title]) + [p for p in pages if p not in entry[title]]
            return
    raise KeyError(f"mkdocs.yml's nav has no section {title!r}")


LINK = re.compile(r"(\]\(|src=\")([^)\"#:]+)")  # a relative link or image target in Markdown or HTML


# Repository files that the site shows as pages of its own: a page links the file (so the link leads somewhere on
# the code host too) and the site's copy of the page links the page made from it.
SITE_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks/index.md", "docs/benchmarks": "benchmarks/index.md",
              "tftoolkit/cli": "reference/cli.md",
              "tftoolkit/config": "reference/config.md", "tftoolkit/summary.py": "reference/summary.md",
              "tftoolkit/catalogue": "reference/hardware.md"}


def site_uri(repo_path: str) -> str | None:
    """The site's page for a file of the repository (a path from its root), or None where the site has none."""
    repo_path = repo_path.rstrip("/")
    if repo_path in SITE_PAGES:
        return SITE_PAGES[repo_path]
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path.startswith("notebooks/") and repo_path.endswith(".ipynb"):
        return repo_path
    return None


def site_links(markdown: str, source: str, uri: str) -> str:
    """``markdown`` of repository file ``source`` as the site's page ``uri``: each relative link to a file the site
    shows (SITE_PAGES, docs/, notebooks/) made the link to that page, relative to ``uri``."""
    here, there = posixpath.dirname(source), posixpath.dirname(uri)

    def fix(m):
        target = site_uri(posixpath.normpath(posixpath.join(here, m.group(2))))
        return m.group(0) if target is None else m.group(1) + posixpath.relpath(target, there or ".")

    return LINK.sub(fix, markdown)


def site_copy(source: str, uri: str) -> str:
    """The Markdown of repository file ``source`` as the site's page ``uri`` (site_links)."""
    return site_links((ROOT / source).read_text(), source, uri)


def _fig(value, unit: str = "") -> str:
    return "" if value is None else f"{value:g}{unit}"


def _sources(entry) -> str:
    keys = sorted({k for text in entry.source.values() if not text.lower().startswith(("unconfirmed", "n/a"))
                   for k in text.split("(")[0].split()})
    unconfirmed = ", ".join(entry.unconfirmed)
    return " ".join(keys) + (f"; unconfirmed: {unconfirmed}" if unconfirmed else "")


def hardware_page() -> str:
    out = ["# Hardware catalogue", "",
           "The GPUs, links and systems the toolkit knows, generated from `tftoolkit/catalogue/*.toml` (the one "
           "place these figures live: MFU's peaks and the planner read them). TFLOP/s are dense; fp16/bf16 are "
           "tensor-core rates with FP32 accumulation; GB/s per direction. The last column names each row's "
           "sources (listed at the end) and the figures still unconfirmed.", "",
           "## GPUs", "",
           "| key | NVML names | FP32 | TF32 | FP16 | BF16 | memory | bandwidth | TDP | PCIe | NVLink | P2P | sources |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in catalogue.gpus():
        nvlink = f"{g.nvlink_version} ({_fig(g.nvlink_gbs, ' GB/s')})" if g.nvlink_version else ""
        p2p = "" if g.peer_to_peer is None else ("yes" if g.peer_to_peer else "no (host memory)")
        out.append("| " + " | ".join(cell(v) for v in (
            g.key, ", ".join(g.names), _fig(g.fp32_tflops), _fig(g.tf32_tflops), _fig(g.fp16_tflops),
            _fig(g.bf16_tflops), _fig(g.memory_gb, " GB"), _fig(g.memory_bandwidth_gbs, " GB/s"), _fig(g.tdp_w, " W"),
            _fig(g.pcie_gen), nvlink, p2p, _sources(g))) + " |")
    out += ["", "## Links", "", "| key | kind | rated | achieved | latency | sources |", "|---|---|---|---|---|---|"]
    for link in catalogue.links():
        out.append("| " + " | ".join(cell(v) for v in (
            link.key, link.kind, _fig(link.gbs, " GB/s"), _fig(link.achieved_gbs, " GB/s"),
            _fig(link.latency_us, " us"), _sources(link))) + " |")
    out += ["", "## Systems", "", "| key | GPUs | inside the host | topology | NICs per host | sources |",
            "|---|---|---|---|---|---|"]
    for sysm in catalogue.systems():
        gpus = f"{sysm.gpus} x {sysm.gpu}" if sysm.gpu else f"{sysm.gpus} (any)"
        nics = f"{sysm.nics} x {sysm.nic}" if sysm.nics else ""
        out.append("| " + " | ".join(cell(v) for v in (
            sysm.key, gpus, sysm.intra_host, sysm.topology, nics, _sources(sysm))) + " |")
    out += ["", "## Sources", ""]
    for kind, title in (("gpu", "GPUs"), ("link", "links"), ("system", "systems")):
        out += [f"### {title}", "", "| key | source |", "|---|---|"]
        out += [f"| {key} | {cell(text)} |" for key, text in catalogue_files.read_file(kind)["sources"].items()]
        out.append("")
    return "\n".join(out)


PAGES = {"index.md": lambda: site_copy("README.md", "index.md"),
         "benchmarks/index.md": lambda: site_copy("BENCHMARKS.md", "benchmarks/index.md"),
         "reference/cli.md": cli_page, "reference/config.md": config_page, "reference/summary.md": summary_page,
         "reference/hardware.md": hardware_page}


def on_config(config):
    extend_nav(config["nav"], "Notebooks", [f"notebooks/{nb.name}" for nb in notebook_files()])
    docs = Path(config["docs_dir"])
    topics = [p for p in sorted((docs / "benchmarks").glob("*.md")) if p.name != "index.md"]
    extend_nav(config["nav"], "Benchmarks", [f"benchmarks/{p.name}" for p in topics if p.stem not in FOR_DEVELOPERS])
    extend_nav(config["nav"], "Developers", [f"benchmarks/{p.name}" for p in topics if p.stem in FOR_DEVELOPERS])
    return config


# Benchmark topics about the toolkit's own code and tests (what a change cost, what the suite takes, what holds on
# GPUs), shown under Developers; every other topic answers a user's question and stays under Benchmarks.
FOR_DEVELOPERS = ("house", "suite-time", "overheads", "breakdown-cost", "measurement", "equivalence", "gpu-truth")


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files, config):
    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    # A plain File rooted outside docs/ (mkdocs-jupyter's page wrapper needs one with a source folder).
    executed = os.environ.get("TFTOOLKIT_DOCS_EXECUTED")
    for nb in notebook_files():
        root = Path(executed) if executed and (Path(executed) / "notebooks" / nb.name).exists() else ROOT
        files.append(File(f"notebooks/{nb.name}", str(root), config["site_dir"], config["use_directory_urls"]))
    return files


def contracts_markdown() -> str:
    """pyproject.toml's import-linter contracts as Markdown: the layers top to bottom, and each other rule."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    out = []
    for c in contracts:
        out += [f"**{c['name']}** (`{c['type']}`)", ""]
        if c["type"] == "layers":
            out += ["| layer (imports only the rows below it) |", "| --- |"]
            out += [f"| {' &#124; '.join(f'`{m.strip()}`' for m in layer.split('|'))} |" for layer in c["layers"]]
        elif c["type"] == "forbidden":
            out += [f"- these: {', '.join(f'`{m}`' for m in c['source_modules'])}",
                    f"- never import: {', '.join(f'`{m}`' for m in c['forbidden_modules'])}"]
        else:
            out += [f"- {k}: {v}" for k, v in c.items() if k not in ("name", "type")]
        out.append("")
    return "\n".join(out)


def parameters_markdown() -> str:
    """Each notebook's parameters cell (the one papermill fills in), with a link to its page."""
    out = []
    for nb in notebook_files():
        cells = json.loads(nb.read_text())["cells"]
        cell = next((c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
        if cell is None:
            raise ValueError(f"{nb.relative_to(ROOT)} has no cell tagged 'parameters'")
        out += [f"### [{nb.stem}]({nb.name})", "", "```python", "".join(cell["source"]).rstrip(), "```", ""]
    return "\n".join(out)


def layout_markdown() -> str:
    """The package's rooms as they are: each subpackage with its docstring's first line and its modules (a
    sub-subpackage with a slash), then the plain modules at the top."""
    import ast

    package = ROOT / "tftoolkit"

    def first_line(path: Path) -> str:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    lines = ["tftoolkit/"]
    for room in sorted(p for p in package.iterdir() if (p / "__init__.py").exists()):
        names = sorted([p.stem for p in room.glob("*.py") if p.stem != "__init__"]
                       + [p.name + "/" for p in room.iterdir() if (p / "__init__.py").exists()])
        lines.append(f"  {room.name + '/':<13} {first_line(room / '__init__.py')}")
        lines.append(f"  {'':<13}   {', '.join(names)}")
    leaves = sorted(p.name for p in package.glob("*.py") if p.stem not in ("__init__", "__main__"))
    lines.append(f"  {' '.join(leaves)}   (the floor: leaves every room may import)")
    return "```\n" + "\n".join(lines) + "\n```"


MARKERS = {"<!-- contracts -->": contracts_markdown, "<!-- notebook-parameters -->": parameters_markdown,
           "<!-- layout -->": layout_markdown}


def on_page_markdown(markdown, page, config, files):
    if not page.file.generated_by:  # docs/<uri>; the generated pages were made with their links (site_copy)
        markdown = site_links(markdown, f"docs/{page.file.src_uri}", page.file.src_uri)
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
