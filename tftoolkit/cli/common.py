"""What every command shares: one-line usage errors, and train options generated from RunConfig's fields."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from ..config import RunConfig, cli_fields, field_types
from .sections import OUTPUT, SECTIONS, section_of

EXIT_USAGE = 2
QUIET_HELP = "print only warnings and the final lines (no progress bars)"  # one text for every command's --quiet


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong and where to look), exit code 2, and no option is
    taken for a prefix of another (``find-lr --steps 5`` would otherwise silently set --steps-per-loop)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,2,5, got {text!r}") from None


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_quiet(parser) -> None:
    parser.add_argument("--quiet", action="store_true", help=QUIET_HELP)


def refuse(parser: argparse.ArgumentParser, old: str, new: str, why: str) -> None:
    """``old`` is no longer an option of this command: using it is a one-line usage error (exit 2) naming ``new``."""

    class Refused(argparse.Action):
        def __call__(self, p, namespace, values, option_string=None):
            p.error(f"{old} is not an option here ({why}): use {new}")

    parser.add_argument(old, nargs="?", action=Refused, help=argparse.SUPPRESS)


def add_config_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> dict:
    """One option per RunConfig field, with the field's help text, type and choices, in the headed groups of
    cli/sections.py. Returns the groups by title (the output group always), so a command adds its own options to
    the group they belong with."""
    hints = field_types()
    by_name = {f.name: f for f in cli_fields()}
    for name in by_name:
        section_of(name)  # a field in no section fails here, naming the file to add it to
    groups = {}
    for title, names in SECTIONS:
        shown = [by_name[n] for n in names if n in by_name and n not in skip]
        if shown or title == OUTPUT:
            groups[title] = parser.add_argument_group(title)
        for f in shown:
            add_field_option(groups[title], f, hints[f.name])
    return groups


def add_field_option(group, f: dataclasses.Field, tp) -> None:
    """The option of one RunConfig field: its help text and default, and bool -> --x/--no-x, list -> I,J,..."""
    args = typing.get_args(tp)
    base = next((a for a in args if a is not type(None)), tp)
    default = f.default
    help_text = f.metadata["help"].replace("%", "%%") + (f" (default: {default})" if default is not None else "")
    kw: dict = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(base) is list:
        kw["type"] = int_list
        kw["metavar"] = "I,J,..."
    else:
        kw["type"] = base
        if f.metadata.get("choices"):
            kw["choices"] = f.metadata["choices"]
        else:
            kw["metavar"] = base.__name__.upper()
    group.add_argument(flag(f.name), **kw)


CONFIG_FILE_HELP = ("start from the options in FILE: a run directory's config.json (its resolved options) or a JSON "
                    "object of option names with _ for -; the options given beside it override it")


def config_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> RunConfig:
    """The RunConfig the command line gives: its options, over ``--config FILE``'s where the command takes one."""
    names = {f.name for f in dataclasses.fields(RunConfig)} - set(skip)
    given = {k: v for k, v in vars(args).items() if k in names}
    if getattr(args, "config_file", None) is None:
        return RunConfig.from_dict(given)
    base = config_file(args.config_file)
    return base.replace(**given) if given else base


def config_file(path: str) -> RunConfig:
    """The RunConfig in a JSON file: a run directory's config.json ({"config": {...}, ...}) or the fields alone; a
    ConfigError naming the file when it cannot be read or holds something else."""
    from .. import fileio
    from ..errors import ConfigError

    try:
        data = fileio.read_json(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--config {path}: cannot be read as JSON ({type(e).__name__}: {str(e).splitlines()[0]})")
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    try:
        return RunConfig.from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"--config {path}: {e}") from None


def subcommands(parser: argparse.ArgumentParser, dest: str, metavar: str = "COMMAND"):
    sub = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=Parser)
    sub.required = True
    return sub


@dataclasses.dataclass(frozen=True)
class Option:
    """A command's option declared as data: its flag (or positional name), argparse's settings, the argument group
    it is listed in, and the fields it fills of the records the command builds (``fills``: record -> field). The
    parser and the records are made from the one declaration, as RunConfig's field metadata makes train's options."""

    flag: str
    settings: dict
    fills: dict = dataclasses.field(default_factory=dict)
    group: str | None = None

    @property
    def dest(self) -> str:
        return self.settings.get("dest") or self.flag.lstrip("-").replace("-", "_")


def add_options(parser, options) -> None:
    """Add ``options`` (Option rows) to ``parser`` in their order, each group made where its first row is."""
    groups: dict[str, object] = {}
    for o in options:
        where = parser
        if o.group is not None:
            if o.group not in groups:
                groups[o.group] = parser.add_argument_group(o.group)
            where = groups[o.group]
        where.add_argument(o.flag, **o.settings)


def filled(args, options, record: str) -> dict:
    """{field: value} of ``record``'s fields that ``options`` fill, from the parsed ``args``."""
    return {o.fills[record]: getattr(args, o.dest) for o in options if record in o.fills}
