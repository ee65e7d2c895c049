"""One meaning per option name across commands, one --quiet text, BooleanOptionalAction for every boolean, and
RunConfig's options in headed --help groups."""

import argparse

import pytest

from tftoolkit import cli
from tftoolkit.cli.common import QUIET_HELP
from tftoolkit.cli.sections import SECTIONS

# The commands that take RunConfig's options (all or most of them).
CONFIG_COMMANDS = (["train"], ["scale"], ["find-lr"], ["find-batch"], ["bench", "input"])


def commands(parser=None, path=()):
    """(path, parser) of every command and sub-command, depth first."""
    parser = parser or cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


def parser_of(path):
    return dict(commands())[tuple(path)]


def test_old_spellings_are_refused_naming_the_new_one(capsys):
    for argv, new in ((["scale", "--replicas", "1,2", "--out", "x"], "use --replica-counts"),
                      (["data-service", "start", "--workers", "2"], "use --service-workers")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and new in err, err


def test_replicas_is_one_count_and_workers_are_training_processes():
    """--replicas takes one integer wherever it is offered; --workers means training worker processes."""
    for path, p in commands():
        for a in p._actions:
            if "--replicas" in a.option_strings and a.help != argparse.SUPPRESS:
                # predict reads it as text to refuse a list with a line naming --replica-counts (exit 2, not
                # argparse's "invalid int value"); tests/planner/test_planner.py checks that refusal.
                assert a.type is int or path == ("predict",), (path, a.type)
            if "--workers" in a.option_strings and a.help != argparse.SUPPRESS:
                assert path in (("train",), ("launch",), ("scale",), ("find-lr",), ("find-batch",),
                                ("bench", "input")), path
    scale = parser_of(["scale"])
    assert cli.build_parser().parse_args(["scale", "--replica-counts", "1,2,4", "--out", "x"]).replica_counts == "1,2,4"
    assert any("--replica-counts" in a.option_strings for a in scale._actions)
    ds = cli.build_parser().parse_args(["data-service", "start", "--service-workers", "3"])
    assert ds.service_workers == 3


SCIENCE = {("find-lr",), ("find-batch",), ("advise",), ("predict",)}  # cli/tuning.py's and cli/predict.py's commands


def quiet_texts(paths):
    return {(path, a.help) for path, p in commands() if paths is None or path in paths
            for a in p._actions if "--quiet" in a.option_strings}


def test_quiet_has_one_help_text():
    texts = {(path, t) for path, t in quiet_texts(None) if path not in SCIENCE}
    assert len(texts) >= 5  # train, scale, sweep, demo, bench allreduce
    assert {t for _, t in texts} == {QUIET_HELP}, sorted(texts)


def test_science_commands_quiet_has_the_same_text():
    texts = quiet_texts(SCIENCE)
    assert texts and {t for _, t in texts} == {QUIET_HELP}, sorted(texts)


def test_booleans_with_a_negative_use_boolean_optional_action():
    """No hand-rolled --x/--no-x pairs: every --no-X is BooleanOptionalAction's."""
    for path, p in commands():
        for a in p._actions:
            for s in a.option_strings:
                if s.startswith("--no-") and any(("--" + s[5:]) in b.option_strings for b in p._actions):
                    assert isinstance(a, argparse.BooleanOptionalAction), (path, s)
    sweep = parser_of(["sweep"])
    wait = next(a for a in sweep._actions if "--wait" in a.option_strings)
    assert isinstance(wait, argparse.BooleanOptionalAction) and "--no-wait" in wait.option_strings
    assert cli.build_parser().parse_args(["sweep", "s.yaml", "--out", "o", "--no-wait"]).wait is False
    assert cli.build_parser().parse_args(["sweep", "s.yaml", "--out", "o"]).wait is True


@pytest.mark.parametrize("path", CONFIG_COMMANDS, ids=" ".join)
def test_help_shows_config_options_in_headed_groups(path):
    """At least five headed groups, each a section of cli/sections.py (train: every section)."""
    p = parser_of(path)
    titles = [g.title for g in p._action_groups if g._group_actions]
    sections = [t for t, _ in SECTIONS]
    headed = [t for t in titles if t in sections]
    assert len(headed) >= 5, titles
    assert headed == [t for t in sections if t in headed]  # in the sections' order
    if path == ["train"]:
        assert headed == sections
        out = next(g for g in p._action_groups if g.title == "checkpoints and output")
        assert {"--out", "--force", "--quiet", "--checkpoint-every"} <= {s for a in out._group_actions
                                                                         for s in a.option_strings}
    help_text = p.format_help()
    for t in headed:
        assert f"\n{t}:\n" in help_text
