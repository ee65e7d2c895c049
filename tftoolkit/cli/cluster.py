"""tftoolkit launch: K worker processes here, or each host's TF_CONFIG; tftoolkit data-service start: a tf.data
service dispatcher and workers."""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from .common import config_from_args


def add(sub) -> None:
    from ..cluster.spec import DEFAULT_JOIN_TIMEOUT_S

    p = sub.add_parser("launch", help="run a train command as K worker processes here (MultiWorkerMirroredStrategy)",
                       description="Start K workers of `tftoolkit train` on this machine (free localhost ports, "
                                   "worker 0 is the chief and writes the run directory), stream their output with a "
                                   "[worker k] prefix. Exit code: the chief's when every worker ends on its own; "
                                   "if one fails first, the others are stopped and the exit code is the failed "
                                   "worker's (128 + N when signal N killed it: 137 after SIGKILL). With "
                                   "--print-tf-config, print each host's TF_CONFIG instead.",
                       usage="tftoolkit launch --workers K [--replicas-per-worker N] [--join-timeout S] "
                             "[--base-port P] -- train [train options] --out RUN_DIR")
    p.add_argument("--workers", type=int, metavar="K", help="worker processes to start")
    p.add_argument("--replicas-per-worker", type=int, metavar="N",
                   help="replicas each worker runs (simulated CPU devices, or its own GPUs); default: the train "
                        "options' --replicas / K, else an equal share of the GPUs, else 1")
    p.add_argument("--join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S, metavar="S",
                   help=f"fail if the workers have not all joined after S seconds (default: {DEFAULT_JOIN_TIMEOUT_S:g})")
    p.add_argument("--base-port", type=int, metavar="P", help="use ports P..P+K-1 (default: free ports the OS picks)")
    p.add_argument("--print-tf-config", metavar="HOSTS",
                   help="print the TF_CONFIG for each of HOSTS (host or host:port, comma-separated; the first is "
                        "the chief) and start nothing")
    p.add_argument("command_args", nargs=argparse.REMAINDER, metavar="-- train ...",
                   help="the training command, after --")
    p.set_defaults(func=run)
    _add_data_service(sub)


def _add_data_service(sub) -> None:
    from ..cluster.dataservice import DEFAULT_PORT, DEFAULT_WORKER_TIMEOUT_S
    from .common import Parser, refuse

    ds = sub.add_parser("data-service", help="a tf.data service to run the input pipeline on more cores or hosts",
                        description="Run TensorFlow's tf.data service: a dispatcher and workers that run the input "
                                    "pipeline and stream batches to trainers started with --data-service ADDRESS.")
    ds_sub = ds.add_subparsers(dest="data_service_command", metavar="WHAT", parser_class=Parser)
    ds_sub.required = True
    p = ds_sub.add_parser(
        "start", help="start a dispatcher and K workers here, or K workers that join --dispatcher",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="tftoolkit data-service start [--port P] [--service-workers K] [--dispatcher ADDRESS] [--work-dir DIR] "
              "[--worker-timeout S] [--host NAME]",
        description=f"""\
Start a tf.data service dispatcher and K workers in this process, or with --dispatcher only K workers that join
a dispatcher running elsewhere. It runs in the foreground, prints the dispatcher's address (the one to give
trainers as --data-service ADDRESS) and each worker's, and stops cleanly on Ctrl-C or SIGTERM (exit code 0). A
worker whose dispatcher no longer answers stops without TensorFlow's stop, which would wait on the dispatcher
forever, and says so (exit code 0).

Two set-ups:
  all on this machine     tftoolkit data-service start --service-workers 2
                          tftoolkit train --data-service grpc://localhost:{DEFAULT_PORT} ...
  workers on CPU hosts    on the GPU server:  tftoolkit data-service start --service-workers 0
  beside a GPU server     on each CPU host:   tftoolkit data-service start --dispatcher gpu1:{DEFAULT_PORT} --service-workers 4
  from a Slurm job step   srun -n 4 tftoolkit data-service start --dispatcher gpu1:{DEFAULT_PORT}
                          (one worker per task, on whichever nodes the step runs)

Workers tell the dispatcher this host's name (--host), and trainers then connect to the workers directly, so
every worker's port must be reachable from the trainers' hosts, not only the dispatcher's.

A worker that dies: TensorFlow (2.21) keeps it registered and its clients keep asking it; they read from the
other workers meanwhile, so a pipeline that repeats goes on at their pace, but a finite dataset never reports its
end until a worker is back at the same address (start it again with the same --port). --worker-timeout only makes the
dispatcher log the loss within seconds (seen with TF_CPP_MIN_LOG_LEVEL=0).
""")
    p.add_argument("--port", type=int, metavar="P",
                   help=f"the dispatcher's port (default: {DEFAULT_PORT}; 0: a free port the OS picks). With "
                        "--dispatcher, the workers' ports P, P+1, ... (default: free ports), so that a worker "
                        "restarted with the same --port is the same worker to the dispatcher")
    p.add_argument("--service-workers", type=int, metavar="K", dest="service_workers",
                   help="tf.data service workers to start in this process (default: 1; 0 runs the dispatcher "
                        "alone, for workers that join from other hosts)")
    refuse(p, "--workers", "--service-workers K", "--workers counts training processes")
    p.add_argument("--dispatcher", metavar="ADDRESS",
                   help="start only workers, joining the dispatcher at ADDRESS (HOST:PORT or grpc://HOST:PORT); it "
                        "must be running: exit 2 when nothing answers there")
    p.add_argument("--work-dir", metavar="DIR",
                   help="run the dispatcher fault-tolerant: it journals its state to DIR, and a dispatcher "
                        "restarted with the same DIR resumes its datasets and jobs (workers and trainers "
                        "reconnect). Default: state in memory only")
    p.add_argument("--worker-timeout", type=float, default=DEFAULT_WORKER_TIMEOUT_S, metavar="S",
                   help="seconds without a heartbeat after which the dispatcher counts a worker as lost "
                        f"(default: {DEFAULT_WORKER_TIMEOUT_S:g}; TensorFlow's own: 600); workers beat every second")
    p.add_argument("--host", metavar="NAME",
                   help="the name other hosts reach this one by, given to the dispatcher with each worker's port "
                        "and printed in the dispatcher's address (default: this host's name)")
    p.set_defaults(func=data_service_start)


def data_service_start(args) -> int:
    from ..cluster import dataservice

    service = dataservice.start(args.port, args.service_workers, args.dispatcher, args.work_dir, args.worker_timeout,
                                args.host)
    lines = []
    if service.local:
        local = "grpc://localhost:" + service.address.rpartition(":")[2]
        lines += [f"tf.data service dispatcher at {service.address}",
                  f"  trainers: --data-service {service.address} (on this machine {local} works too)"]
        if service.work_dir:
            lines.append(f"  fault-tolerant: journal in {service.work_dir}")
    else:
        lines.append(f"joining the tf.data service dispatcher at {service.address}")
    lines += [f"worker {k} at {a}" for k, a in enumerate(service.worker_addresses)]
    lines.append("serving until Ctrl-C or SIGTERM")
    print("\n".join(lines), flush=True)  # at once: a parent reading the pipe waits for the address
    dataservice.serve_until_signal(service)
    if dataservice.stop_servers(service):
        print("stopped", flush=True)
        return 0
    # TensorFlow's stop would never return, and interpreter exit would call it (a server's destructor): leave at
    # once, with the exit code a stop on a signal promises.
    import os
    import sys

    print(f"stopped, skipping TensorFlow's stop of the workers: the dispatcher at {service.address} does not "
          "answer, and that stop would wait on it forever (for a clean stop, start the dispatcher again first)",
          flush=True)
    sys.stderr.flush()
    os._exit(0)


def train_command(argv: list[str]):
    """The training command after ``--``, checked and parsed: (argv starting with "train", RunConfig)."""
    from . import build_parser

    argv = list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if argv[:1] != ["train"]:
        raise ConfigError("give the training command after --, e.g. tftoolkit launch --workers 2 -- train --out "
                          f"runs/mw (got {' '.join(argv) or 'nothing'})")
    args = build_parser().parse_args(argv)  # a bad train option is the usual one-line usage error
    return argv, config_from_args(args)


def run(args) -> int:
    import sys

    from ..cluster import launch

    if args.print_tf_config:
        print(launch.tf_config_lines(args.print_tf_config, args.workers, args.base_port), end="")
        return 0
    if args.workers is None:
        raise ConfigError("launch needs --workers K (or --print-tf-config HOSTS); see tftoolkit launch --help")
    argv, config = train_command(args.command_args)
    launch.stop_on_sigterm()
    return launch.launch(argv, config, args.workers, args.replicas_per_worker, args.join_timeout, args.base_port,
                         out=sys.stdout, err=sys.stderr)
