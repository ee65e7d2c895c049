"""Every shell command in README.md and the docs' code blocks that starts with ``tftoolkit`` parses with the CLI's
own parsers: a dry parse of its options (nothing runs), so a renamed or removed option cannot linger in the docs."""

import contextlib
import io
import re
import shlex

import pytest

from tftoolkit import cli

from helpers import ROOT

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`(tftoolkit [^`]*--[^`]*)`")  # an inline command with an option: `tftoolkit doctor --json`
OPTIONAL = re.compile(r"\[[^\[\]]*\]")  # [--timeout S], [train options]: optional parts a reader fills in or leaves


def documents():
    yield ROOT / "README.md"
    yield ROOT / "BENCHMARKS.md"
    yield from sorted(p for p in (ROOT / "docs").rglob("*.md"))


def commands(text: str):
    """(line, inline) of each ``tftoolkit ...`` command: the fenced code blocks' lines (continuations joined), then
    the inline code spans in the prose."""
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("tftoolkit "):
                yield line, False
    for span in INLINE.findall(FENCE.sub("", text)):
        yield " ".join(span.split()), True


def argv(line: str) -> list[str]:
    """The arguments as a reader would type them: without the comment, the optional [...] parts and "...", and
    with the first of alternatives like weak|strong."""
    line = re.sub(r"\s+#\s.*$", "", line)
    while OPTIONAL.search(line):
        line = OPTIONAL.sub(" ", line)
    words = [w for w in shlex.split(line)[1:] if w != "..."]
    return [w.split("|")[0] if re.fullmatch(r"[\w.-]+(\|[\w.-]+)+", w) else w for w in words]


def dry_parse(words: list[str], elided: bool = False) -> str | None:
    """None if ``tftoolkit WORDS`` parses, else what argparse said. ``elided``: the line is part of a command (it
    said "..." for the rest, or it is a fragment quoted in the prose), so a required option left out (--out) and a
    placeholder in capitals where a value goes (--replicas N) are the reader's to fill in, not mistakes; an option
    that does not exist, or is spelt the old way, still is one."""
    parser = cli.build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, extra = parser.parse_known_args(words)
    except SystemExit as e:
        said = err.getvalue()
        placeholder = re.search(r"invalid (choice|int value|float value): '[A-Z][A-Z_]*'", said)
        if e.code == 0 or (elided and ("the following arguments are required" in said or placeholder)):
            return None  # --help exits 0
        return f"exit {e.code}: {err.getvalue().strip()}"
    if extra:
        return f"unrecognized arguments: {' '.join(extra)}"
    if getattr(args, "command", None) == "launch" and args.command_args:
        return dry_parse([w for w in args.command_args if w != "--"], elided)
    return None


ALL = [(p.relative_to(ROOT).as_posix(), line, inline) for p in documents() for line, inline in commands(p.read_text())]


def test_the_docs_show_commands_of_every_kind():
    assert len(ALL) >= 40
    shown = {argv(line)[0] for _, line, _ in ALL if argv(line)}
    assert {"train", "scale", "sweep", "doctor", "advise", "predict", "data-service", "launch"} <= shown, shown


@pytest.mark.parametrize("where, line, inline", ALL, ids=[f"{w}:{l[:60]}" for w, l, _ in ALL])
def test_every_documented_command_parses(where, line, inline):
    problem = dry_parse(argv(line), elided=inline or "..." in line)
    assert problem is None, f"{where}: {line}\n{problem}"


@pytest.mark.parametrize("line, problem", [
    ("tftoolkit scale --replicas 1,2 --out x", "exit 2"),             # the old spelling
    ("tftoolkit train --no-such-option --out x", "unrecognized"),
    ("tftoolkit launch --workers 2 -- train --bogus --out x", "unrecognized"),
    ("tftoolkit data-service start --workers 2", "use --service-workers"),
])
def test_a_command_with_a_wrong_option_is_caught(line, problem):
    assert problem in (dry_parse(argv(line)) or "")
