"""What every command shares: one-line usage errors, and train options generated from RunConfig's fields."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from ..config import RunConfig, cli_fields, field_types

EXIT_USAGE = 2


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


def add_config_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One option per RunConfig field, with the field's help text, type and choices."""
    hints = field_types()
    group = parser.add_argument_group("training options (RunConfig fields)")
    for f in cli_fields():
        if f.name in skip:
            continue
        tp = hints[f.name]
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


def config_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> RunConfig:
    names = {f.name for f in dataclasses.fields(RunConfig)} - set(skip)
    return RunConfig.from_dict({k: v for k, v in vars(args).items() if k in names})


def subcommands(parser: argparse.ArgumentParser, dest: str, metavar: str = "COMMAND"):
    sub = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=Parser)
    sub.required = True
    return sub
