"""Every shell command in README.md and the docs' code blocks that starts with ``tftoolkit`` parses with the CLI's
own parsers: a dry parse of its options (nothing runs), so a renamed or removed option cannot linger in the docs.
Then every complete one runs, as written, on CPU (smoke sizes), and the README's quick start works in a new shell."""

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


# --- running them ---------------------------------------------------------------------------------------------
# Every complete command of the pages is run as written, in one working folder (so `predict runs/r4` finds the run
# an earlier page trained, as a reader who follows them in order would), in a fresh interpreter with 8 simulated
# replicas. What a training reads and how long it runs is shrunk, the same for every command: options appended
# after the page's own, where argparse takes the last. Not run, each for the reason given beside it.
SMOKE = ["--dataset", "synthetic", "--image-size", "16", "--train-images", "4096", "--steps", "8",
         "--steps-per-loop", "4", "--no-measure",  # the breakdown traces two more engines per run (test_breakdown)
         "--no-eval-every-epoch"]  # the evaluation traces one more per run and replica count; evaluation on 1-8
# replicas is checked as one device's in tests/engine/test_equivalence.py and read back in tests/data/test_pipeline.py
# A smaller per-replica batch where the page does not fix the global batch (tasks.md's strong scaling does): the
# figures the commands print are not what is checked here, and resnet20's 8-replica steps were half its CPU after
# the trace (2026-12-05: 82 s of CPU for that one count as the pages' smoke was, 68 s with batch 16, 70 s without
# the evaluation; one run each at load 7-9).
SMALL_BATCH = ["--per-replica-batch", "16"]
# A scale of a model other than the default runs at the page's two smallest counts: tracing resnet20's step costs
# more with every replica (2026-12-05, quiet machine: 4.7, 10.8, 29.8 and ~70 s of tracing on 1, 2, 4 and 8, so 4 and
# 8 were 100 of the command's 122 s). That a scale runs on 8 replicas is shown by tasks.md's strong scaling, which runs
# the default model on all of its counts; resnet20 on more than one replica is checked against one device in
# tests/engine/test_equivalence.py.
SCALED_MODEL_COUNTS = 2
TRAINS = ("train", "scale")
NOT_RUN = {
    "--backend": "a sweep on Slurm (tests/cluster/test_slurm.py runs them on a one-node Slurm)",
    "data-service": "a server that runs until it is stopped (tests/data/ start and stop it)",
    "launch": "several worker processes (tests/cluster/ run them)",
    "tensorboard": "a server that runs until it is stopped",
    "doctor": "its checks run in notebook 00's test (tests/experiments/test_notebooks.py)",
    "bench": "the all-reduce bench runs in notebooks 00 and 03's tests",
    "--allreduce-csv": "reads the all-reduce bench's files, and the bench is not run here (tests/planner/test_predict.py "
                       "forecasts from hand-made ones)",
    "find-batch": "bisects the memory over many trainings (tests/tuning/ test it)",
    "sweep": "a sweep runs notebooks (tests/experiments/test_sweep.py); its --dry-run is run here",
    "needs GPUs": "the page says it needs GPUs, and gives the CPU variant beside it",
}


def _why_not_run(line: str, words: list[str]) -> str | None:
    if "needs GPUs" in line:
        return NOT_RUN["needs GPUs"]
    if words[0] == "sweep" and "--dry-run" in words and "--backend" not in words:
        return None
    for key in ("--backend", "data-service", "launch", "tensorboard", "doctor", "bench", "find-batch", "sweep",
                "--allreduce-csv"):
        if key in words[:1] or (key.startswith("--") and key in words):
            return NOT_RUN[key]
    return None


def runnable():
    """(where, argv) of each complete command in reading order (README first), each distinct command once."""
    seen, out = set(), []
    for where, line, inline in ALL:
        if inline or "..." in line or re.search(r"\b[A-Z][A-Z0-9_]+\b|\[", re.sub(r"\s+#\s.*$", "", line)):
            continue  # a fragment with placeholders (RUN, DIR, [options]): test_every_documented_command_parses
        words = argv(line)
        if not words or _why_not_run(line, words) or tuple(words) in seen:
            continue
        seen.add(tuple(words))
        out.append((where, words + smoke(words)))
    return out


def smoke(words: list[str]) -> list[str]:
    """The options that shrink a training command (nothing for the others)."""
    if "--help" in words or words[0] not in (*TRAINS, "find-lr"):
        return []
    if words[0] == "find-lr":  # its least; find-lr has no --steps, --no-measure or evaluation to turn off
        return [w for w in SMOKE if w not in ("--steps", "8", "--no-measure", "--no-eval-every-epoch")] + [
            "--lr-steps", "10"]
    batch = [] if "--global-batch" in words else SMALL_BATCH
    if words[0] == "scale" and "--model" in words and "--replica-counts" in words:
        counts = words[words.index("--replica-counts") + 1].split(",")[:SCALED_MODEL_COUNTS]
        batch = batch + ["--replica-counts", ",".join(counts)]
    if "--profile-steps" in words:  # the profiled steps must be trained
        last = int(words[words.index("--profile-steps") + 1].split("-")[-1])
        return [w if w != "8" else str(last + 4) for w in SMOKE] + batch
    return SMOKE + batch


def test_the_smoke_options_shrink_a_model_s_scale_to_two_counts_and_leave_the_default_s_counts():
    def counts(line):  # the counts argparse takes: the last --replica-counts
        words = argv(line) + smoke(argv(line))
        return [words[i + 1] for i, w in enumerate(words) if w == "--replica-counts"][-1]

    assert counts("tftoolkit scale --replica-counts 1,2,4,8 --model resnet20 --out x") == "1,2"
    assert counts("tftoolkit scale --replica-counts 1,2,4,8 --mode strong --global-batch 512 --out x") == "1,2,4,8"
    ran = [words for _, words in runnable() if words[0] == "scale"]
    assert any("8" in counts("tftoolkit " + " ".join(w)).split(",") for w in ran), ran  # 8 replicas still run


def model_files(folder):
    """The model module the pages show, where a reader would put it (a ``# mypackage/models.py`` block)."""
    for page in documents():
        for block in FENCE.findall(page.read_text()):
            first = block.splitlines()[0] if block.strip() else ""
            m = re.match(r"# ([\w/]+\.py)", first)
            if m:
                path = folder / m.group(1)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block)
                (path.parent / "__init__.py").touch()


DRIVER = """
import json, os, sys
import tftoolkit
from tftoolkit import cli
tftoolkit.init_devices(8)
done = []
for where, words in json.load(open(sys.argv[1])):
    print(f"=== {where}: tftoolkit {' '.join(words)}", file=sys.stderr, flush=True)
    try:
        rc = cli.main(words)
    except SystemExit as e:
        rc = e.code
    done.append([where, words, rc])
    json.dump(done, open(sys.argv[2], "w"))
"""


@pytest.mark.slow  # one interpreter, 18 commands: 213 s on a quiet machine when tasks.md's resnet20 scale ran all of
# its four counts (122 s of it; 2026-12-05), 122 s with it on its two smallest
def test_every_complete_command_runs_as_written_on_cpu(tmp_path):
    # Failed before the fixes: predict on the CPU-simulated runs/r4 exited 2, --model mypackage.models:build from
    # the working folder exited 2 (ModuleNotFoundError), and every shrunk training reported images/sec NaN as "ok".
    import json
    import math
    import subprocess
    import sys

    jobs = runnable()
    said = {w[0] for _, w in jobs}
    assert {"train", "scale", "predict", "advise", "find-lr", "sweep", "data"} <= said, said
    model_files(tmp_path)
    (tmp_path / "sweeps").symlink_to(ROOT / "sweeps")
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    run = subprocess.run([sys.executable, "-c", DRIVER, "jobs.json", "done.json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=1500, env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
                                                        "TFTOOLKIT_PROGRESS": "0"})
    done = json.loads((tmp_path / "done.json").read_text()) if (tmp_path / "done.json").exists() else []
    failed = [f"{w}: tftoolkit {' '.join(a)} -> exit {rc}" for w, a, rc in done if rc not in (0, None)]
    assert run.returncode == 0 and len(done) == len(jobs) and not failed, "\n".join(failed) + run.stderr[-6000:]
    for where, words, _ in done:
        out = tmp_path / words[words.index("--out") + 1] if "--out" in words else None
        if words[0] == "train" and "--help" not in words:
            rate = json.loads((out / "summary.json").read_text())["images_per_sec"]
            assert rate is not None and rate > 0, f"{where}: {words}: images/sec {rate}"
        if words[0] == "scale":
            import pandas as pd

            table = pd.read_csv(out / "scaling.csv")
            assert (table["status"] == "ok").all() and table["images_per_sec"].map(math.isfinite).all(), table


@pytest.mark.slow  # a subprocess
def test_the_readme_s_commands_work_in_a_new_shell_after_make_demo(tmp_path):
    # Failed before the fix: the README's next command, `tftoolkit --help`, was "command not found" in a new shell
    # (make demo installs into .venv, and the README never said to activate it).
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text()
    block = next(b for b in FENCE.findall(readme) if re.search(r"^tftoolkit ", b, re.M) and "make" not in b)
    setup = [line for line in block.splitlines() if line.strip() and not line.startswith("tftoolkit ")]
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')  # what make's venv gives, in miniature
    (bin_dir / "tftoolkit").write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m tftoolkit "$@"\n')
    (bin_dir / "tftoolkit").chmod(0o755)
    script = "\n".join(setup + ["tftoolkit --help >/dev/null"])
    done = subprocess.run(["bash", "-ec", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, f"in a new shell after make demo:\n{script}\n{done.stderr}"
