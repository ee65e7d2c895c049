"""``tftoolkit data-service start``: a tf.data service dispatcher and workers, in the foreground.

When the host's cores cannot decode and augment as fast as its GPUs train, TensorFlow's tf.data service moves
the input pipeline into worker processes, on this host or on CPU hosts beside it, which stream ready batches
to the trainers. This module starts TensorFlow's own servers (``DispatchServer``, ``WorkerServer``); it does not
build a service of its own. Two set-ups:

    all here          tftoolkit data-service start --service-workers 2
    workers beside    on the GPU server:  tftoolkit data-service start --service-workers 0
                      on each CPU host:   tftoolkit data-service start --dispatcher gpu1:5050 --service-workers 4
                      or from Slurm:      srun -n 4 tftoolkit data-service start --dispatcher gpu1:5050

and the trainers get ``--data-service grpc://gpu1:5050``. parse_address, normalise and reachable check the
addresses this command is given.

What TensorFlow 2.21 does when a worker dies (read in its dispatcher and client sources, and seen here):
the dispatcher notices the missing heartbeats after ``worker_timeout_ms`` (TF's default: 10 min), but only
logs "Lost worker" and drops it from its auto-scaling metric. The worker stays registered with its tasks, so
a client keeps asking it: each failed request is skipped and the client reads from the other workers, so a
pipeline that repeats goes on at the rest's pace, but a finite dataset never reports its end (the dead worker's
task never finishes), and in "distributed_epoch" mode the elements that worker had taken are lost. A worker
restarted at the same address (``--port``) gets its tasks back (in "parallel_epochs" mode it makes its epoch again
from the start, so elements it had delivered come twice), and the dataset's end arrives. The short worker
timeout below therefore only makes the loss show in the dispatcher's log within seconds; it does not hand the
dead worker's share to the others.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import socket
import threading

from ..config.rules import service_address
from ..data.service import normalise, reachable
from ..engine.devices import import_tensorflow
from ..errors import ConfigError
from . import spec

# TensorFlow is imported inside the functions that need it: ``tftoolkit data-service``'s option checks
# (cli/cluster.py) run before anything needs TensorFlow.

PROTOCOL = "grpc"               # the only protocol TensorFlow's servers speak without extra set-up
DEFAULT_PORT = 5050             # the dispatcher port TensorFlow's own examples use; --port 0: one the OS picks
DEFAULT_WORKER_TIMEOUT_S = 5.0  # five missed heartbeats; TF's default (10 min) hides a dead worker for that long
HEARTBEAT_MS = 1000             # a worker learns of a new job only at its next heartbeat: TF's default of 30 s would
                                # hold a run's first batch up to 30 s
CHECK_INTERVAL_MS = 1000        # how often the dispatcher looks for lost workers (TF's default: every 10 min, which
                                # would make any worker timeout shorter than that moot)
REACH_TIMEOUT_S = 2.0           # a dispatcher that does not accept a TCP connection within this is not there
STOP_TIMEOUT_S = 10.0           # a worker stops in well under a second while its dispatcher answers (stop_servers)


# --- addresses: parsed once (config.rules.service_address), normalised and checked by the client side -------------
parse_address = service_address
__all__ = ["parse_address", "normalise", "reachable", "this_host", "start", "serve_until_signal", "stop_servers",
           "Service", "STOP_TIMEOUT_S"]


def this_host() -> str:
    """The name other hosts reach this one by: its hostname, or localhost where that name does not resolve.

    Not getfqdn(), which asks reverse DNS and says "localhost" on machines without it. A worker tells the
    dispatcher this name, and clients then dial it: TensorFlow's default, localhost, works on this machine only.
    """
    name = socket.gethostname()
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "localhost"


# --- servers ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Service:
    """The servers this process runs. ``address`` is the dispatcher's, in the form clients pass to
    ``--data-service``; ``worker_addresses`` are the workers' as the dispatcher hands them to clients."""

    address: str
    worker_addresses: list[str]
    local: bool                      # the dispatcher runs in this process (not joined with --dispatcher)
    work_dir: str | None
    servers: list = dataclasses.field(default_factory=list, repr=False)  # workers first, then the dispatcher

    def stop(self) -> None:
        """Stop the workers, then the dispatcher (a client reading from a worker then gets an error at once,
        not a wait on a dispatcher that is gone)."""
        for server in self.servers:
            server.stop()
        self.servers = []


def start(port: int | None = None, workers: int | None = None, dispatcher: str | None = None,
          work_dir: str | None = None, worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
          host: str | None = None) -> Service:
    """Start a dispatcher and ``workers`` workers here, or with ``dispatcher``, only workers that join it.

    Every check that can fail (a busy port, a malformed or unreachable dispatcher) runs before TensorFlow is
    imported, so a mistake costs a second, not an import, and is one ConfigError line.
    ``port``: the dispatcher's (default DEFAULT_PORT, 0: one the OS picks), or with ``dispatcher`` the first worker's
    (default: free ports). ``workers`` defaults to 1; 0 with no ``dispatcher`` runs the dispatcher alone, for
    workers elsewhere.
    """
    workers = 1 if workers is None else workers
    if not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"--service-workers must be an integer >= 0, got {workers!r}")
    if not worker_timeout_s > 0:
        raise ConfigError(f"--worker-timeout must be > 0 seconds, got {worker_timeout_s}")
    host = host or this_host()
    if not host or any(c.isspace() or c in ":/" for c in host):
        raise ConfigError(f"--host must be a host name or IPv4 address, got {host!r}")
    if dispatcher is not None:
        return _join(dispatcher, workers, port, work_dir, host)
    port = DEFAULT_PORT if port is None else port
    if not 0 <= port < 65536:
        raise ConfigError(f"--port must be from 0 to 65535 (0: a free port), got {port}")
    if port:
        spec.check_port_free(port, "the dispatcher's --port")
    if work_dir:
        try:
            os.makedirs(work_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--work-dir {work_dir} cannot be created ({e.strerror}); give a folder this user "
                              "may write") from None

    tf = import_tensorflow()  # its start-up lines held, its objects frozen (engine/devices.py)
    svc = tf.data.experimental.service
    config = svc.DispatcherConfig(port=port, protocol=PROTOCOL, work_dir=work_dir or None,
                                  fault_tolerant_mode=bool(work_dir),  # journal to work_dir: a restart resumes
                                  worker_timeout_ms=int(worker_timeout_s * 1000),
                                  job_gc_check_interval_ms=CHECK_INTERVAL_MS)
    try:
        server = svc.DispatchServer(config)
    except RuntimeError as e:  # taken between the check above and now: gRPC says only "Could not start"
        raise ConfigError(f"the dispatcher could not listen on port {port} ({e}); choose another --port") from None
    bound = parse_address(server.target)[1]
    service = Service(normalise(f"{host}:{bound}"), [], True, work_dir or None, [server])
    _add_workers(service, f"localhost:{bound}", spec.free_ports(workers), host)
    return service


def _join(dispatcher: str, workers: int, port: int | None, work_dir, host: str) -> Service:
    """Workers only, for a dispatcher that runs elsewhere; ``port``: the first worker's (default: free ports)."""
    address = normalise(dispatcher, "--dispatcher")  # ConfigError when malformed
    if workers < 1:
        raise ConfigError(f"--service-workers {workers} with --dispatcher starts nothing; give --service-workers 1 or more")
    if work_dir:
        raise ConfigError("--work-dir is the dispatcher's journal; give it where the dispatcher starts")
    ports = spec.free_ports(workers)
    if port is not None:
        if not 0 < port <= 65536 - workers:
            raise ConfigError(f"--port must leave room for {workers} worker ports below 65536, got {port}")
        ports = [port + k for k in range(workers)]
        for k, p in enumerate(ports):
            spec.check_port_free(p, f"worker {k}'s port, --port {port} + {k}")
    if not reachable(address):
        raise ConfigError(f"nothing answers at --dispatcher {dispatcher} (no TCP connection within "
                          f"{REACH_TIMEOUT_S:g} s); start the dispatcher first (tftoolkit data-service start) "
                          "and check the host name and port")
    service = Service(address, [], False, None)
    _add_workers(service, address.partition("://")[2], ports, host)
    return service


def _add_workers(service: Service, dispatcher: str, ports: list[int], host: str) -> None:
    tf = import_tensorflow()
    svc = tf.data.experimental.service
    # Ports chosen here rather than by gRPC (port 0), so that the address a worker gives the dispatcher names
    # this host, not TensorFlow's default "localhost", without reading the port back through a private API.
    for port in ports:
        address = f"{host}:{port}"
        # Returns once the worker has registered with the dispatcher (TensorFlow retries until it has).
        worker = svc.WorkerServer(svc.WorkerConfig(dispatcher_address=dispatcher, worker_address=address, port=port,
                                                   protocol=PROTOCOL, heartbeat_interval_ms=HEARTBEAT_MS))
        service.servers.insert(len(service.worker_addresses), worker)
        service.worker_addresses.append(address)


def serve_until_signal(service: Service) -> None:
    """Block until SIGINT or SIGTERM (the caller then stops ``service`` with stop_servers).

    TensorFlow's own ``join()`` blocks in C++, where Python signal handlers never run; waiting on an Event in
    short slices keeps the main thread where a handler can stop it.
    """
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_servers(service: Service, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop ``service``'s servers; False, with nothing stopped, when they joined a dispatcher that no longer answers.

    A worker whose dispatcher is gone never returns from TensorFlow's stop (2.21, distributed_epoch): stopping its
    task joins the task's prefetch thread, which waits on the dispatcher for the next split with no deadline, and
    the stop holds the GIL meanwhile, so no Python thread or signal handler can bound it. Hence the check first;
    on False the caller must leave with ``os._exit`` (a server's destructor would stop it again at exit). For a
    dispatcher that dies during the stop, faulthandler's watchdog (a C thread, no GIL needed) ends the process
    after ``timeout_s`` seconds with its thread dump on stderr and exit code 1.
    """
    if not service.local and not reachable(service.address, REACH_TIMEOUT_S):
        return False
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    try:
        service.stop()
    finally:
        faulthandler.cancel_dump_traceback_later()
    return True
