"""tftoolkit launch: worker arguments, TF_CONFIG printing, bad input as one line (exit 2), and a launch that fails
(a worker crashing at start, one that never joins, workers that disagree) ends quickly and leaves no process."""

import os
import socket
import sys
import time

import psutil
import pytest

from tftoolkit import cli, gpus
from tftoolkit.cli import cluster as cli_cluster
from tftoolkit.cluster import launch, spec as multiworker
from tftoolkit.config import RunConfig
from tftoolkit.errors import ClusterError, ConfigError

from helpers import assert_no_tensorflow

TRAIN = ["train", "--out", "runs/x", "--steps", "2"]


def _plan(argv, workers, n=None):
    """What ``tftoolkit launch --workers W --replicas-per-worker N -- ARGV`` plans."""
    return launch.plan(*cli_cluster.train_command(argv), workers, n)


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture
def no_leftovers():
    """Fails the test if it leaves a process of its own behind."""
    before = _descendants()
    yield
    deadline = time.time() + 5
    while _descendants() - before and time.time() < deadline:
        time.sleep(0.1)
    assert _descendants() - before == set(), "processes left behind"


# --- planning ---------------------------------------------------------------------------------------------
def test_plan_adds_workers_and_total_replicas(monkeypatch):
    monkeypatch.setattr(gpus, "ids", lambda environ=None: [])
    p = _plan(["--", *TRAIN], 2, 2)
    assert p.argv[-4:] == ["--workers", "2", "--replicas", "4"] and p.replicas_per_worker == 2 and p.gpu_slices is None
    assert _plan([*TRAIN, "--replicas", "6"], 3).replicas_per_worker == 2
    assert _plan(TRAIN, 2).replicas_per_worker == 1  # CPU: one simulated replica per worker by default


def test_plan_gives_each_worker_its_own_gpus(monkeypatch):
    monkeypatch.setattr(gpus, "ids", lambda environ=None: ["0", "1", "2", "3"])
    p = _plan(TRAIN, 2)
    assert p.replicas_per_worker == 2 and p.gpu_slices == [["0", "1"], ["2", "3"]]
    with pytest.raises(ConfigError, match=r"need 6 GPUs; this process may use 4 \(0,1,2,3\)"):
        _plan(TRAIN, 2, 3)


@pytest.mark.parametrize("argv, workers, n, message", [
    (TRAIN, 0, None, "--workers must be an integer >= 1, got 0"),
    (TRAIN, 2, 0, "--replicas-per-worker must be >= 1"),
    (["env"], 2, None, "give the training command after --"),
    ([], 2, None, "got nothing"),
    ([*TRAIN, "--replicas", "4"], 2, 3, "--replicas 4 (all workers' replicas) is not --workers 2 x --replicas-per-worker 3"),
    ([*TRAIN, "--replicas", "3"], 2, None, "does not divide"),
    ([*TRAIN, "--workers", "3"], 2, None, "say --workers 3 but the launch has --workers 2"),
    ([*TRAIN, "--gpus", "0,1"], 2, None, "--gpus names one process's GPUs"),
])
def test_plan_refuses_bad_requests(monkeypatch, argv, workers, n, message):
    monkeypatch.setattr(gpus, "ids", lambda environ=None: [])
    with pytest.raises(ConfigError) as e:
        _plan(argv, workers, n)
    assert message in str(e.value)


def test_the_train_options_give_the_config():
    c = RunConfig(replicas=4, workers=2, per_replica_batch=16, base_lr=0.05, augment=True, deterministic=False,
                  gpus=None, model="small_cnn", epochs=2.5)
    args = cli.build_parser().parse_args(["train", "--out", "x", "--replicas", "4", "--workers", "2",
                                          "--per-replica-batch", "16", "--base-lr", "0.05", "--augment",
                                          "--no-deterministic", "--model", "small_cnn", "--epochs", "2.5"])
    assert cli.config_from_args(args) == c


def test_a_config_file_is_the_config_and_the_options_beside_it_override_it(tmp_path):
    import json

    from tftoolkit.errors import ConfigError

    c = RunConfig(replicas=4, workers=2, per_replica_batch=16, base_lr=0.05, augment=True, deterministic=False,
                  model="small_cnn", epochs=2.5, measure_budget=0.25)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"config": c.to_dict(), "derived": {}}))  # a run directory's config.json
    parse = cli.build_parser().parse_args
    assert cli.config_from_args(parse(["train", "--out", "x", "--config", str(path)])) == c
    over = cli.config_from_args(parse(["train", "--out", "x", "--config", str(path), "--global-batch", "128"]))
    assert over == c.replace(global_batch=128) and over.per_replica_batch is None  # the batch given one way
    path.write_text(json.dumps({"base_lr": 0.2}))  # the fields alone
    assert cli.config_from_args(parse(["train", "--out", "x", "--config", str(path)])) == RunConfig(base_lr=0.2)
    for text, said in (("{not json", "cannot be read as JSON"), (json.dumps({"bogus": 1}), "unknown config key")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"--config {path}: .*{said}"):
            cli.config_from_args(parse(["train", "--out", "x", "--config", str(path)]))
    with pytest.raises(ConfigError, match="cannot be read"):
        cli.config_from_args(parse(["train", "--out", "x", "--config", str(tmp_path / "absent.json")]))


def test_train_here_hands_the_workers_the_config_as_a_file_not_as_options(tmp_path, monkeypatch):
    import json

    seen = {}

    def fake_launch(argv, config, workers, **kw):
        seen["argv"], seen["file"] = argv, json.loads(open(argv[argv.index("--config") + 1]).read())
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "summary.json").write_text(json.dumps({"status": "ok"}))
        return 0

    monkeypatch.setattr(launch, "launch", fake_launch)
    c = RunConfig(replicas=4, workers=2, per_replica_batch=16, base_lr=0.05, measure_budget=0.3)
    assert launch.train_here(c, tmp_path / "run", quiet=True)["status"] == "ok"
    assert seen["argv"][:3] == ["train", "--out", str(tmp_path / "run")] and "--base-lr" not in seen["argv"]
    assert RunConfig.from_dict(seen["file"]["config"]) == c and seen["file"]["written_by"] == "tftoolkit"


# --- the CLI: one line, exit code 2 -------------------------------------------------------------------------
def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_k_below_one_is_exit_2(capsys, no_leftovers):
    assert cli.main(["launch", "--workers", "0", "--", *TRAIN]) == 2
    assert "--workers must be an integer >= 1, got 0" in _one_line_error(capsys)


def test_missing_workers_is_exit_2(capsys):
    assert cli.main(["launch", "--", *TRAIN]) == 2
    assert "launch needs --workers K" in _one_line_error(capsys)


def test_port_in_use_is_exit_2(capsys, no_leftovers):
    holder = socket.socket()
    holder.bind(("", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        assert cli.main(["launch", "--workers", "2", "--base-port", str(port - 1), "--", *TRAIN]) == 2
    finally:
        holder.close()
    err = _one_line_error(capsys)
    assert f"port {port} (worker 1's port, --base-port {port - 1} + 1" in err and "is in use" in err


def test_print_tf_config_gives_each_host_its_task(capsys):
    assert cli.main(["launch", "--print-tf-config", "node1,node2:2222,node3"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("export TF_CONFIG=")]
    configs = [multiworker.parse_tf_config(l.split("=", 1)[1].strip("'")) for l in lines]
    assert [c.worker_id for c in configs] == [0, 1, 2]
    assert configs[0].addresses == ("node1:12345", "node2:2222", "node3:12345") and configs[0].is_chief
    assert cli.main(["launch", "--workers", "2", "--print-tf-config", "a,b,c"]) == 2


# --- failing launches end, and end clean ----------------------------------------------------------------------
def _envs(n, launch_dir, ports=None):
    addresses = [f"localhost:{p}" for p in (ports or multiworker.free_ports(n))]
    return [{**os.environ, "TF_CONFIG": multiworker.tf_config(addresses, k), multiworker.ENV_LAUNCH_DIR: launch_dir,
             multiworker.ENV_JOIN_TIMEOUT: "120", multiworker.ENV_LAUNCHER_PID: str(os.getpid())} for k in range(n)]


def _train_cmd(out, *extra):
    return [sys.executable, "-m", "tftoolkit", "train", "--out", str(out), "--quiet", "--workers", "2", "--steps", "2",
            "--dataset", "synthetic", "--image-size", "8", "--train-images", "256", "--no-measure", *extra]


def _py(code):
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_a_worker_that_never_joins_fails_the_launch_in_time(tmp_path, no_leftovers):
    d = str(tmp_path)
    started_then_waits = _py(f"import pathlib, time; pathlib.Path({d!r}, 'started-0').touch(); time.sleep(600)")
    t0 = time.time()
    with pytest.raises(ClusterError) as e:
        launch.spawn([started_then_waits, _py("import time; time.sleep(600)")], _envs(2, d), d, join_timeout=2)
    assert time.time() - t0 < 10
    assert str(e.value) == ("the cluster did not form within --join-timeout 2 s: worker(s) 1 never reached the "
                            "rendezvous; worker(s) 0 waited for the others. Raise --join-timeout if start-up is slow here")


@pytest.mark.slow
def test_a_worker_crashing_at_start_stops_the_others(tmp_path, no_leftovers):
    # Worker 0 is a real training worker; worker 1 crashes once worker 0 waits at the rendezvous, so the
    # launcher must stop a TensorFlow process blocked in MultiWorkerMirroredStrategy (it ignores SIGTERM there).
    d = str(tmp_path)
    crash = _py(f"import pathlib, sys, time\nwhile not pathlib.Path({d!r}, 'started-0').exists(): time.sleep(0.05)\n"
                "time.sleep(1); print('boom: no such dataset', file=sys.stderr); sys.exit(3)")
    t0 = time.time()
    with pytest.raises(ClusterError, match="worker 1 exit code 3 before joining the cluster: boom: no such dataset"):
        launch.spawn([_train_cmd(tmp_path / "run", "--replicas", "2"), crash], _envs(2, d), d, join_timeout=120)
    assert time.time() - t0 < 90


@pytest.mark.slow
def test_workers_with_different_replica_counts_are_refused(tmp_path, no_leftovers):
    d = str(tmp_path)
    with pytest.raises(ClusterError) as e:
        launch.spawn([_train_cmd(tmp_path / "run", "--replicas", "4"), _train_cmd(tmp_path / "run", "--replicas", "2")],
                     _envs(2, d), d, join_timeout=120)
    msg = str(e.value)
    assert "exit code 2 before joining the cluster" in msg
    assert ("workers run different numbers of replicas: worker 0 has 2 (CPU-simulated), worker 1 has 1 "
            "(CPU-simulated)") in msg
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("code, says", [(2, "Its message above says what to fix; then run the command again"),
                                        (1, "Run the same command again to resume from the last checkpoint."),
                                        (-9, "Run the same command again to resume from the last checkpoint.")])
def test_after_a_failed_worker_the_launcher_says_what_will_help(tmp_path, no_leftovers, code, says):
    # Exit code 2 is a usage error (a bad --dataset found after joining, say): a rerun would meet it again, so the
    # launcher does not suggest resuming; a crash or a kill may resume.
    import io

    d = str(tmp_path)
    joined = "import os, pathlib, sys, time\n" + "".join(
        f"pathlib.Path({d!r}, '{m}-{{k}}').touch()\n" for m in ("started", "joined"))
    fail = joined.format(k=1) + ("os.kill(os.getpid(), 9)" if code < 0 else f"print('error: bad', file=sys.stderr); sys.exit({code})")
    wait = joined.format(k=0) + "time.sleep(600)"
    err = io.StringIO()
    rc = launch.spawn([_py(wait), _py(fail)], _envs(2, d), d, join_timeout=60, err=err)
    assert rc == launch.exit_code(code)  # the failed worker's code (137 after SIGKILL), as --help says
    assert says in err.getvalue()
    if code < 0:
        assert rc == 128 + 9


def test_a_killed_worker_is_named_as_the_cause_not_the_peer_that_failed_after_it(tmp_path, no_leftovers,
                                                                                   monkeypatch):
    # Worker 1 is SIGKILLed; worker 0 then fails on its closed connections (here: exits 1 as soon as worker 1 is
    # dead). Seen at the same poll, the launcher names the killed worker and returns its code, not worker 0's.
    import io

    monkeypatch.setattr(launch, "POLL_S", 1.0)  # both ends land between two polls
    d = str(tmp_path)
    joined = "import os, pathlib, sys, time\n" + "".join(
        f"pathlib.Path({d!r}, '{m}-{{k}}').touch()\n" for m in ("started", "joined"))
    victim = joined.format(k=1) + f"pathlib.Path({d!r}, 'pid').write_text(str(os.getpid()))\ntime.sleep(0.5)\n" \
                                  "os.kill(os.getpid(), 9)"
    peer = joined.format(k=0) + f"""
while not pathlib.Path({d!r}, 'pid').exists():
    time.sleep(0.01)
pid = pathlib.Path({d!r}, 'pid').read_text()
while True:
    try:
        if open(f'/proc/{{pid}}/stat').read().split(')')[-1].split()[0] in ('Z', 'X'):
            break
    except FileNotFoundError:
        break
    time.sleep(0.001)
print('UnavailableError: Socket closed', file=sys.stderr)
sys.exit(1)
"""
    err = io.StringIO()
    rc = launch.spawn([_py(peer), _py(victim)], _envs(2, d), d, join_timeout=60, err=err)
    assert "worker 1 failed (killed by SIGKILL)" in err.getvalue() and rc == 128 + 9, err.getvalue()


def test_the_launcher_and_the_data_service_command_import_no_tensorflow_until_they_run():
    """The launcher only starts and watches workers: importing it loaded TensorFlow (3.6 s of CPU per launch here)
    through cluster/workers.py's strategy import, now made where a worker joins. The data service imports it when a
    server starts."""
    assert_no_tensorflow("import tftoolkit.cluster.launch, tftoolkit.cluster.dataservice, tftoolkit.cli.cluster")
