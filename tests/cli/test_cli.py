"""The command line: every option documented, bad input gets one line and exit code 2, no traceback."""

import json
import os
import subprocess
import sys

import pytest

from tftoolkit import cli
from tftoolkit.config import cli_fields

from helpers import FAST_ARGS, ROOT


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "tftoolkit", *args], capture_output=True, text=True, timeout=timeout)


def _user_lines(stderr: str) -> list[str]:
    # TensorFlow's C++ runtime prints its own start-up lines (absl) that no setting silences in 2.21.
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith(("WARNING: All log messages", "I0000", "W0000", "E0000"))]


def test_train_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    required = ["--replicas", "--gpus", "--per-replica-batch", "--global-batch", "--base-lr", "--base-batch", "--lr-rule",
                "--warmup-epochs", "--schedule", "--optimizer", "--epochs", "--steps", "--model", "--dataset",
                "--precision", "--jit", "--seed", "--cross-device-ops", "--steps-per-loop", "--checkpoint-every",
                "--quiet", "--out", "--force"]
    for flag in required:
        assert flag in text, flag
    for f in cli_fields():
        assert "--" + f.name.replace("_", "-") in text


@pytest.mark.parametrize("argv, match", [
    (["train", "--out", "X", "--replicas", "0"], "replicas must be > 0"),
    (["train", "--out", "X", "--per-replica-batch", "0"], "per_replica_batch must be > 0"),
    (["train", "--out", "X", "--base-lr", "-0.1"], "base_lr must be a finite number > 0"),
    (["train", "--out", "X", "--replicas", "3", "--global-batch", "100"], "does not divide by replicas=3"),
    (["train", "--out", "X", "--lr-rule", "cubic"], "invalid choice: 'cubic'"),
    (["train", "--out", "X", "--optimizer", "adagrad"], "invalid choice: 'adagrad'"),
    (["train", "--out", "X", "--precision", "fp8"], "invalid choice: 'fp8'"),
    (["train", "--out", "X", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["train", "--replicas", "2"], "the following arguments are required: --out"),
    (["train", "--out", "X", "--gpus", "0,x"], "expected comma-separated integers"),
    (["train", "--out", "X", "--replicas", "3", "--cross-device-ops", "hierarchical_copy", "--dataset", "synthetic"],
     "hierarchical_copy at 3 replicas: TensorFlow's hierarchical copy splits the devices into two groups"),
    (["train", "--out", "X", "--replicas", "2", "--global-batch", "64", "--per-replica-batch", "16"],
     "global_batch=64 and per_replica_batch=16 disagree on 2 replica(s) (16 x 2 = 32); give one or the other"),
    (["train", "--out", "X", "--dataset", "synthetic", "--train-images", "999999"],
     "--train-images 999999: synthetic has 16000 training images; give at most 16000"),
    (["train", "--out", "FILE", "--dataset", "synthetic"], "is a file, not a folder: give the run directory a name"),
    (["train", "--out", "FILE/sub", "--dataset", "synthetic"], "FILE is a file, not a folder; give the run directory a path"),
    (["find-lr", "--out", "X", "--steps", "5"], "unrecognized arguments: --steps 5 (see tftoolkit find-lr --help)"),
    (["find-lr", "--out", "X", "--noise-scale"], "unrecognized arguments: --noise-scale"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, match):
    (tmp_path / "FILE").write_text("a file where a folder is asked for")
    argv = [str(tmp_path / "X") if a == "X" else a.replace("FILE", str(tmp_path / "FILE")) for a in argv]
    match = match.replace("FILE", str(tmp_path / "FILE"))
    with pytest.raises(SystemExit) as e:
        code = cli.main(argv)
        raise SystemExit(code)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
    assert not (tmp_path / "X" / "summary.json").exists()


@pytest.mark.slow
def test_gpus_on_a_machine_without_gpus(tmp_path):
    r = run_cli("train", "--out", str(tmp_path / "g"), "--gpus", "0,2")
    assert r.returncode == 2
    lines = _user_lines(r.stderr)
    assert len(lines) == 1 and "asked for GPUs, but this machine has none" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_unknown_model_and_existing_run_dir_through_the_cli(tmp_path, capsys):
    common = ["--replicas", "2", "--per-replica-batch", "16", "--steps", "2", "--dataset", "synthetic",
              "--image-size", "16", "--train-images", "256", "--no-measure", "--quiet", *FAST_ARGS]
    # Refused at set-up, after TensorFlow started (the exit status and stderr a shell sees, from the console
    # script's own exit path: test_the_command_exits_with_mains_code_after_threads_atexit_and_flushing).
    assert cli.main(["train", "--out", str(tmp_path / "m"), *common, "--model", "nope"]) == 2  # the last --model counts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'nope'" in err[0]
    assert not (tmp_path / "m" / "summary.json").exists()

    assert cli.main(["train", "--out", str(tmp_path / "r"), *common]) == 0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "ok"
    assert "status ok" in capsys.readouterr().out
    assert cli.main(["train", "--out", str(tmp_path / "r"), *common, "--base-lr", "0.003"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a different run" in err[0] and "--force" in err[0]
    assert cli.main(["train", "--out", str(tmp_path / "r"), *common, "--base-lr", "0.003", "--force"]) == 0


_RUN = """
import atexit, sys, threading, time
from pathlib import Path
from tftoolkit import cli
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("finished")
threading.Thread(target=late).start()  # not a daemon: a normal exit waits for it, so this one must too
sys.argv = ["tftoolkit", *sys.argv[2:]]
if sys.argv[1:] == ["none"]:  # a command that returns None exits 0, as sys.exit(None) does
    cli.main = lambda: None
cli.run()
"""


@pytest.mark.slow
@pytest.mark.parametrize("argv, code", [(["env", "--json"], 0), (["train", "--out", "X", "--replicas", "0"], 2),
                                         (["none"], 0)])
def test_the_command_exits_with_mains_code_after_threads_atexit_and_flushing(tmp_path, argv, code):
    # cli.run() skips the interpreter's teardown (os._exit); everything a normal exit guarantees must still hold.
    done = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path), *argv], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == code, done.stderr[-2000:]
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "finished"
    if argv[0] == "env":
        assert json.loads(done.stdout)["gpus"] == []  # all of a piped stdout arrived
    elif argv[0] == "train":
        assert "replicas must be > 0" in done.stderr


@pytest.mark.slow
def test_env_command_runs_without_gpu():
    r = run_cli("env", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["gpus"] == []


def test_the_demo_s_time_is_stated_once_and_the_readme_says_the_same(capsys):
    # The figure lives in experiments/demo.py (MINUTES); --help reads it, and the README must quote it.
    from tftoolkit.experiments import demo

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert f"about {demo.MINUTES} minutes" in " ".join(capsys.readouterr().out.split())
    readme = (ROOT / "README.md").read_text()
    assert f"(about {demo.MINUTES} minutes on a quiet 2-core machine" in readme
    assert "about 10 min" not in readme


def test_a_sweep_rerun_exits_0_when_nothing_new_failed_and_lists_kept_failures(monkeypatch, capsys, tmp_path):
    from tftoolkit.experiments.sweep import local as sweep_mod

    spec = tmp_path / "s.yaml"
    spec.write_text("notebook: x.ipynb\n")
    monkeypatch.setattr("tftoolkit.experiments.sweep.spec.load", lambda path: object())
    counts = {"ok": 2, "diverged": 0, "failed": 1, "timeout": 0, "cancelled": 0, "pending": 0, "queued": 0,
              "running": 0}
    for new, code in ((0, 0), (1, 1)):
        monkeypatch.setattr(sweep_mod, "run", lambda *a, **k: {"counts": counts, "new_failures": new,
                                                               "results": "r.csv", "report": None,
                                                               "report_error": None})
        assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--quiet"]) == code
        out = capsys.readouterr().out
        assert ("1 point(s) failed, timed out or were cancelled in an earlier run" in out) == (new == 0)


@pytest.mark.parametrize("error, says", [
    (MemoryError(), "failed: out of host memory (MemoryError, no size given)"),
    (MemoryError("Unable to allocate 1.09 TiB for an array"), "out of host memory (MemoryError: Unable to allocate "
                                                              "1.09 TiB for an array)"),
])
def test_an_exhausted_memory_names_what_ran_out_and_what_to_lower(monkeypatch, capsys, error, says):
    import resource

    from tftoolkit.cli import train

    def exhausted(args):
        raise error

    monkeypatch.setattr(train, "run", exhausted)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (3_000_000 * 1024, resource.RLIM_INFINITY))
    rc = cli.main(["train", "--dataset", "synthetic", "--out", "unused"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert says in err[0], err
    for fix in ("--per-replica-batch", "--image-size", "--data-memory-gb", "--replicas"):
        assert fix in err[0], err
    assert "address-space limit of 3.1 GB (ulimit -v)" in err[0], err


def test_the_command_table_says_what_each_module_registers():
    """`tftoolkit --help` is printed from cli.COMMANDS alone; each line must be the one the command's own module
    registers, in the same order, and each command must live in the module the table names."""
    import argparse

    def listed(parser):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return [(c.dest, c.help) for c in sub._choices_actions]

    full = listed(cli.build_parser())
    assert full == [(name, helptext) for name, (_, helptext) in cli.COMMANDS.items()]
    assert listed(cli.build_parser(None)) == full
    for name, (module, _) in cli.COMMANDS.items():
        one = cli.build_parser(name)
        assert listed(one) == full
        built = {n for n, p in next(a for a in one._actions if isinstance(a, argparse._SubParsersAction)).choices.items()
                 if p._actions[1:]}  # a stub has only -h
        assert built == {n for n, (m, _) in cli.COMMANDS.items() if m == module}, name


def test_the_top_level_help_and_a_light_command_import_no_command_module():
    """The front door imports what a command runs and nothing else: the top level's help builds no command's
    parser, and no command's parser (every one built, predict's and the finders' included) loads pandas, the
    notebooks' libraries, matplotlib or TensorFlow."""
    code = ("import sys; from tftoolkit import cli; cli.build_parser(None); "
            "a = sorted(m for m in sys.modules if m.startswith('tftoolkit.cli.') and m != 'tftoolkit.cli.common' "
            "and m != 'tftoolkit.cli.sections'); cli.build_parser(); "
            "b = [m for m in ('pandas', 'nbformat', 'nbconvert', 'papermill', 'matplotlib', 'tensorflow') "
            "if m in sys.modules]; print(a, b)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []"


@pytest.mark.parametrize("argv", [["scale", "--replica-counts", "1"], ["find-lr"], ["find-batch"],
                                  ["bench", "allreduce", "--replicas", "2"], ["sweep", "spec.yaml"], ["demo"], ["data", "prepare"],
                                  ["advise", "RUN"], ["predict", "RUN"], ["train"]])
def test_every_command_that_writes_refuses_an_empty_out(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, "--out", " "]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out is empty" in err[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written into the working folder
