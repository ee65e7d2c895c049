"""tftoolkit data-service start: addresses parsed and normalised the way tf.data's distribute() takes them, bad
input as one line and exit 2 before TensorFlow is imported, and real servers: the address printed, a clean stop
on SIGTERM/SIGINT, and workers that join a running dispatcher and serve a dataset read in this process."""

import collections
import re
import signal
import socket
import subprocess
import sys

import pytest

from helpers import ROOT, ServiceProcess, data_service
from tftoolkit import cli
from tftoolkit.cluster import dataservice
from tftoolkit.engine import devices
from tftoolkit.errors import ConfigError

START = ["data-service", "start"]


def _closed_port() -> int:
    """A port nothing listens on (bound and released: the OS does not hand it out again at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- addresses --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, host, port", [
    ("node1:5050", "node1", 5050),
    ("grpc://node1:5050", "node1", 5050),
    (" 10.0.0.7:1 ", "10.0.0.7", 1),
    ("[::1]:65535", "[::1]", 65535),
])
def test_parse_address_takes_host_port_with_or_without_grpc(text, host, port):
    assert dataservice.parse_address(text) == (host, port)
    assert dataservice.normalise(text) == f"grpc://{host}:{port}"


@pytest.mark.parametrize("text, message", [
    ("", "--data-service is empty"),
    ("node1", "'node1' is not HOST:PORT"),
    ("node1:", "is not HOST:PORT"),
    (":5050", "is not HOST:PORT"),
    ("node1:0", "port from 1 to 65535"),
    ("node1:65536", "port from 1 to 65535"),
    ("node1:50x", "is not HOST:PORT"),
    ("::1:5050", "is not HOST:PORT"),
    ("node 1:5050", "is not HOST:PORT"),
    ("http://node1:5050", "uses protocol 'http'; the tf.data service speaks grpc:// only"),
    ("grpc://grpc://node1:5050", "is not HOST:PORT"),
])
def test_parse_address_refuses_what_is_not_host_port(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        dataservice.parse_address(text)
    with pytest.raises(ConfigError, match="^--data-service "):
        dataservice.normalise(text, "--data-service")


def test_reachable_is_a_tcp_connect():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert dataservice.reachable(f"localhost:{s.getsockname()[1]}")
        assert dataservice.reachable(f"grpc://127.0.0.1:{s.getsockname()[1]}", timeout_s=0.5)
    assert not dataservice.reachable(f"localhost:{_closed_port()}", timeout_s=0.5)


# --- bad input: one line, exit 2, before any server starts --------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--service-workers", "-1"], "--service-workers must be an integer >= 0, got -1"),
    (["--port", "70000"], "--port must be from 0 to 65535"),
    (["--worker-timeout", "0"], "--worker-timeout must be > 0 seconds"),
    (["--dispatcher", "node1"], "--dispatcher 'node1' is not HOST:PORT"),
    (["--dispatcher", "http://node1:5050"], "uses protocol 'http'"),
    (["--dispatcher", "node1:5050", "--service-workers", "0"], "--service-workers 0 with --dispatcher starts nothing"),
    (["--dispatcher", "node1:5050", "--work-dir", "j"], "--work-dir is the dispatcher's journal"),
    (["--host", "a:b"], "--host must be a host name"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    assert cli.main(START + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tftoolkit data-service: error: ") and message in err


def test_a_port_in_use_exits_2_naming_it(capsys):
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        assert cli.main(START + ["--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"port {port} (the dispatcher's --port) is in use" in err
        # Joining workers take --port P, P+1, ... (a restarted worker keeps its address): checked the same way.
        assert cli.main(START + ["--dispatcher", f"localhost:{_closed_port()}", "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"port {port} (worker 0's port, --port {port} + 0) is in use" in err


def test_an_unreachable_dispatcher_exits_2_naming_it():
    # The command itself, so the exit code is the process's: nothing there, and it says so at once.
    address = f"localhost:{_closed_port()}"
    done = subprocess.run([sys.executable, "-m", "tftoolkit", *START, "--dispatcher", address], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        f"tftoolkit data-service: error: nothing answers at --dispatcher {address} (no TCP connection within 2 s); "
        "start the dispatcher first (tftoolkit data-service start) and check the host name and port")


# --- real servers -----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_start_prints_the_address_and_stops_cleanly_on_a_signal(tmp_path, sig):
    journal = tmp_path / "journal"
    p = ServiceProcess("--port", "0", "--service-workers", "2", "--work-dir", str(journal))
    try:
        p.wait_serving()
        host = dataservice.this_host()
        address = p.address()
        assert re.fullmatch(rf"grpc://{re.escape(host)}:\d+", address)
        assert dataservice.reachable(address.replace(host, "localhost"))
        workers = [line for line in p.lines if line.startswith("worker")]
        assert len(workers) == 2
        assert all(re.fullmatch(rf"worker {k} at {re.escape(host)}:\d+", w) for k, w in enumerate(workers))
        assert f"  fault-tolerant: journal in {journal}" in p.lines
        assert (journal / "tf_data_dispatcher_journal").is_dir()  # the journal a restarted dispatcher resumes from
        p.proc.send_signal(sig)
        assert p.proc.wait(timeout=10) == 0
        assert p.lines[-1] == "stopped"
        # The servers import TensorFlow through devices.import_tensorflow: its start-up lines are held there too
        noise = [line for line in p.err if devices.startup_noise(line)]
        assert not noise, noise[:4]
    finally:
        p.kill()


@pytest.fixture(scope="module")
def service_with_two_workers():
    """A dispatcher process and two worker processes that joined it with --dispatcher (tests/helpers.data_service,
    which other test modules can use the same way)."""
    with data_service(workers=2) as service:
        yield service


@pytest.mark.slow
def test_workers_join_a_running_dispatcher_and_serve(service_with_two_workers):
    import tensorflow as tf

    address = service_with_two_workers.address
    assert re.fullmatch(r"grpc://localhost:\d+", address)

    def read(mode):
        ds = tf.data.Dataset.range(10).apply(tf.data.experimental.service.distribute(mode, address))
        return collections.Counter(int(x) for x in ds.as_numpy_iterator())

    # parallel_epochs: every worker produces the whole dataset, so two workers that serve give each element twice;
    # distributed_epoch: the workers share one epoch, each element once.
    assert read("parallel_epochs") == {i: 2 for i in range(10)}
    assert read("distributed_epoch") == {i: 1 for i in range(10)}


@pytest.mark.slow
def test_a_second_start_on_the_same_port_exits_2_naming_it(service_with_two_workers):
    port = int(service_with_two_workers.address.rpartition(":")[2])
    # A check of our own: gRPC would bind the busy port anyway (SO_REUSEPORT) and share its connections between
    # the two dispatchers.
    done = subprocess.run([sys.executable, "-m", "tftoolkit", *START, "--port", str(port)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"tftoolkit data-service: error: port {port} (the dispatcher's --port) is in use on this machine")
    assert all(w.proc.poll() is None for w in service_with_two_workers.workers)


# A client that keeps a job open on the service: the worker then has a task, which is what makes its shutdown
# wait on the dispatcher. Its own process, killed by pid (a client's iterator would retry a dead dispatcher forever).
_READER = """
import sys, time
import tensorflow as tf
ds = tf.data.Dataset.range(10**9).apply(tf.data.experimental.service.distribute("distributed_epoch", sys.argv[1]))
it = iter(ds)
for _ in range(20):
    next(it)
print("reading", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_worker_whose_dispatcher_died_still_stops_on_sigterm():
    import time

    from helpers import env_with_tests_on_path

    dispatcher = ServiceProcess("--port", "0", "--service-workers", "0", "--host", "localhost")
    worker = reader = None
    try:
        address = dispatcher.wait_serving().address()
        # The reader starts beside the worker (their TensorFlow imports overlap): its job waits for a worker.
        worker = ServiceProcess("--dispatcher", address, "--host", "localhost")
        reader = subprocess.Popen([sys.executable, "-c", _READER, address], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=env_with_tests_on_path())
        worker.wait_serving()
        assert reader.stdout.readline().strip() == "reading"
        dispatcher.kill()
        time.sleep(2)  # the worker's heartbeats now fail
        # A hang-guard, not a timing: without a bound on the shutdown the worker was still there after minutes.
        assert worker.stop(timeout=60) == 0
        time.sleep(0.5)  # the output threads read the last line
        assert worker.lines[-1] == (
            f"stopped, skipping TensorFlow's stop of the workers: the dispatcher at {address} does not answer, "
            "and that stop would wait on it forever (for a clean stop, start the dispatcher again first)")
    finally:
        if reader is not None:
            reader.kill()
            reader.wait(timeout=10)
        for p in (worker, dispatcher):
            if p is not None:
                p.kill()


def test_a_stop_that_does_not_return_ends_the_process_after_the_timeout():
    # The backstop for a dispatcher that dies while the workers stop: a stand-in server whose stop never returns.
    code = """
import time
from tftoolkit.cluster import dataservice
class Stuck:
    def stop(self):
        time.sleep(120)
dataservice.stop_servers(dataservice.Service("grpc://localhost:1", [], True, None, [Stuck()]), timeout_s=1)
print("returned")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert "Timeout (0:00:01)!" in done.stderr and "in stop" in done.stderr
