"""tftoolkit predict: its options declared once, as data (``options``), from which both its parser and the
forecast's inputs are made: predict.Scenario with a run directory, planner.Plan without one. Each Option row names
the fields it fills (``fills``), as RunConfig's field metadata makes train's options; what depends on the path (a
default that differs, a count from the model) the commands below say in the open."""

from __future__ import annotations

import json

from ..config import ALLREDUCE_DTYPES, DEFAULT_MAX_REPLICAS, SCALING_MODES
from ..errors import ConfigError
from .common import Option, add_options, filled

PLAN_GROUP = "forecast without a run directory (hardware from tftoolkit/catalogue)"
SCENARIO, PLAN = "scenario", "plan"  # the records the options fill: predict.Scenario, planner.Plan
BOTH = lambda name: {SCENARIO: name, PLAN: name}  # noqa: E731  (a field of the same name in both)


def options() -> tuple[Option, ...]:
    """predict's options in the order --help lists them."""
    # choices and links are light (no NumPy, no pandas): --help builds without the planner
    from ..planner import choices, links

    return (
        Option("run_dir", dict(nargs="?", help="measured run directory (summary.json with compute_time_s or a "
                                               "1-replica step_time_s); without one, forecast from --gpu and "
                                               "--params/--model (the catalogue's hardware)")),
        *_plan_options(),
        Option("--out", dict(help="where to write prediction.csv/json and figures (default: RUN_DIR)")),
        Option("--interconnect", dict(help="comma-separated links inside a host: " + ", ".join(links.PRESETS)
                                           + " or NAME=GBps[:latency_us] (default: all intra-host presets, or none "
                                             "with --allreduce-csv)"),
               {SCENARIO: "interconnects", PLAN: "interconnect"}),
        Option("--inter-host", dict(help="link between hosts (default: ib200 with a run directory when "
                                         "--max-replicas spans several hosts, the system's NIC without)"),
               {PLAN: "inter_host"}),
        Option("--allreduce-csv", dict(nargs="+", help="allreduce.csv file(s) or their directories from `tftoolkit "
                                                       "bench allreduce` (one per GPU count): with a run directory, "
                                                       "fit bandwidth and latency to them; with --gpu, their bus "
                                                       "bandwidth per GPU count replaces the catalogue's link, "
                                                       "extrapolated past the largest count measured"),
               {SCENARIO: "allreduce_csv"}),
        Option("--impl", dict(help="all-reduce implementation to fit in the CSV (default: the fastest)"),
               {SCENARIO: "impl"}),
        Option("--mode", dict(choices=SCALING_MODES, default="weak",
                              help="weak: keep the per-replica batch; strong: keep the global batch (default: weak)"),
               {SCENARIO: "mode"}),
        Option("--devices", dict(choices=choices.DEVICES, default="dedicated",
                                 help="dedicated: one device per replica (GPUs); shared: replicas share the host's "
                                      "cores (CPU-simulated replicas) (default: dedicated)"),
               {SCENARIO: "devices"}),
        *_step_options(choices),
        *layout_options(),
        Option("--nics-per-host", dict(type=int, help="NICs per host for the inter-host link (default: 1, or the "
                                                      "system's)"),
               {PLAN: "nics_per_host"}),
        Option("--measured", dict(nargs="+",
                                  help="run directories or scaling.csv to compare the prediction with, each on the "
                                       "hosts it ran on: a summary.json's or table's hosts and gpus_per_host where "
                                       "written, else a multi-worker run's workers (one per host), else whole hosts "
                                       "of --gpus-per-host; over several hosts the comparison takes --inter-host "
                                       "(refused when none is given)"),
               {SCENARIO: "measured"}),
        Option("--compute-ms", dict(type=float, metavar="MS",
                                    help="the compute of one forward/backward pass on one GPU at the run's per-replica "
                                         "batch (with accumulation, of one micro-batch), in ms, instead of the run's "
                                         "own: needed to forecast GPUs from a run on CPU-simulated replicas (refused "
                                         "otherwise: a GPU computes far faster, so communication would weigh more "
                                         "than such a forecast says)"),
               BOTH("compute_ms")),
        host_cores_option(),
    )


def layout_options() -> tuple[Option, ...]:
    """--max-replicas and --gpus-per-host, declared once for predict and advise (which lists them too)."""
    from ..planner import choices

    return (
        Option("--max-replicas", dict(type=int, default=DEFAULT_MAX_REPLICAS,
                                      help=f"most GPUs to consider (default: {DEFAULT_MAX_REPLICAS})"),
               {SCENARIO: "max_replicas"}),
        Option("--gpus-per-host", dict(type=int, default=choices.DEFAULT_GPUS_PER_HOST,
                                       help="GPUs in each host: counts past it are whole hosts joined by --inter-host "
                                            f"(default: {choices.DEFAULT_GPUS_PER_HOST})"),
               BOTH("gpus_per_host")),
    )


def host_cores_option() -> Option:
    """--host-cores, declared once for predict and advise."""
    return Option("--host-cores", dict(type=int, metavar="N",
                                       help="cores of each GPU host (and of each tf.data service worker) when saying "
                                            "at which GPU count input becomes the limit, from the run's input rate "
                                            "per core (default: the run's own host, input_cores x workers)"),
                  {SCENARIO: "host_cores"})


def _plan_options() -> tuple[Option, ...]:
    """The options of a forecast without a run directory: the GPU, the model and its rate."""
    return tuple(Option(flag, settings, {PLAN: name} if name else {}, PLAN_GROUP) for flag, name, settings in (
        ("--gpu", "gpu", dict(help="GPU name as nvidia-smi prints it, or an alias (v100, a100, h100-sxm, "
                                   "rtx-4090...)")),
        ("--params", None, dict(type=int, metavar="N", help="the model's parameter count")),
        ("--model", "model", dict(help="a registered model or keras.applications name, whole with its classifier "
                                       "head as published rows ran it (NAME_headless: without it): parameters, FLOPs "
                                       "and training memory counted; not with --params")),
        ("--image-size", None, dict(type=int, default=224,
                                    help="input size for --model's count, 1 to 4096 pixels (default: 224)")),
        ("--per-replica-batch", "per_replica_batch", dict(type=int, help="examples per GPU per step")),
        ("--images-per-sec", "images_per_sec", dict(type=float, metavar="R",
                                                    help="a measured or published single-GPU rate at that batch "
                                                         "(default: from FLOPs over the peak)")),
        ("--precision", "precision", dict(choices=("float32", "mixed_float16", "mixed_bfloat16"), default="float32",
                                          help="Keras policy; float32 runs as TF32 on Ampere and later, as "
                                               "TensorFlow does by default")),
        ("--replica-counts", None, dict(default="1,2,4,8", help="GPU counts to forecast (default: 1,2,4,8)")),
        ("--replicas", None, dict(help="one GPU count (a list is --replica-counts)")),
        ("--overhead-ms", "overhead_ms", dict(type=float, metavar="MS",
                                              help="fixed cost of each multi-GPU step, ms (default: the value fitted "
                                                   "to the published validation rows together with --straggler's)")),
        ("--json", None, dict(action="store_true", help="print the forecast as JSON on stdout")),
    ))


def _step_options(choices) -> tuple[Option, ...]:
    """predict's model of a step: the all-reduce's overlap, dtype and packs, accumulation, the exchange inside a
    host and the straggler's wait."""
    return (
        Option("--overlap", dict(type=float, help="fraction of the all-reduce hidden behind the backward pass, at "
                                                  "most that pass (2/3 of one micro-step's compute) (default: none "
                                                  "with one pack, as this toolkit's step; modelled from "
                                                  "--allreduce-packs with several)"),
               BOTH("overlap")),
        Option("--allreduce-dtype", dict(choices=ALLREDUCE_DTYPES,
                                         help="dtype the gradients travel in: the run's gradient bytes are converted "
                                              "from its own dtype (summary allreduce_dtype; float32 for older runs) by "
                                              "bytes per element, so bfloat16 and float16 move half of float32's "
                                              "(default: the run's)"),
               {SCENARIO: "allreduce_dtype"}),
        Option("--allreduce-packs", dict(type=int, metavar="P",
                                         help="all-reduce in P packs of equal bytes, last layers first, each its own "
                                              "call (so the latency is paid P times). Without --overlap the first P-1 "
                                              "are modelled, not measured, to go while the backward pass runs and the "
                                              "last after it: hidden = (P-1)/P x min(all-reduce, backward pass); "
                                              "nothing is hidden with --accumulate > 1, where the step all-reduces "
                                              "after its micro-batches (default: the run's)"),
               {SCENARIO: "allreduce_packs"}),
        Option("--accumulate", dict(type=int, metavar="K",
                                    help="micro-batches per replica per optimizer step: a step is modelled as K x the "
                                         "compute of one micro-batch (the run's step compute / its own accumulate) "
                                         "plus one all-reduce, so communication's share falls as K grows; global "
                                         "batch = per-replica batch x replicas x K (default: the run's)"),
               {SCENARIO: "accumulate"}),
        Option("--algorithm", dict(choices=choices.ALGORITHMS, default="ring",
                                   help="the exchange inside a host: ring (NCCL 2+, Horovod, the collective ops; this "
                                        "toolkit's own step), tree (NCCL's double binary tree), star (reduce_to_one: "
                                        "CPU replicas, GPUs without NCCL), hierarchical-copy "
                                        "(HierarchicalCopyAllReduce: a star in each half, the halves' main devices "
                                        "exchanging); without a run directory also ring-in-order (NCCL 1.x: one ring "
                                        "in device order), host (the variables in host memory: a parameter server on "
                                        "the CPU, CentralStorageStrategy) and parameter-server (variables spread over "
                                        "the GPUs, the largest tensor's holder the bottleneck: tf_cnn_benchmarks' "
                                        "default). 16-bit gradient compaction is --allreduce-dtype float16 (default: "
                                        "ring)"),
               BOTH("algorithm")),
        Option("--straggler", dict(type=float, metavar="SIGMA",
                                   help="a replica's compute's variation from step to step (coefficient of "
                                        "variation): a synchronous step waits for the slowest of N, compute x (1 + "
                                        "SIGMA x E[max of N normals]) (default: the value fitted to the published "
                                        "validation rows, on dedicated devices; none with --devices shared)"),
               BOTH("straggler")),
    )


def add(sub) -> None:
    p = sub.add_parser("predict", help="forecast throughput, speedup and efficiency on N GPUs, from a measured run or "
                                       "from the model and the catalogue's hardware",
                       description="Scaling model: step time = K micro-steps of compute x the wait for the slowest "
                                   "replica + all-reduce(gradient bytes in the all-reduce dtype, GPUs per host, hosts, "
                                   "in P packs) - overlap. Compute from a run directory (or --compute-ms), or without "
                                   "one from --images-per-sec or the model's FLOPs over the GPU's peak; links from "
                                   "presets, an allreduce.csv or the catalogue (tftoolkit/catalogue). Every GPU "
                                   "forecast carries an interval from the published validation rows "
                                   "(validation/published.csv; docs/guides/planner.md), and says at which GPU count "
                                   "the host's input becomes the limit (input_limit in prediction.json).")
    add_options(p, options())
    p.set_defaults(func=predict_command)


def predict_command(args) -> int:
    from ..planner import predict

    if args.replicas is not None and "," in str(args.replicas):
        raise ConfigError(f"--replicas is one GPU count; for a list write --replica-counts {args.replicas}")
    if args.run_dir is None:
        return plan_command(args)
    scenario = predict.Scenario(
        **filled(args, options(), SCENARIO),
        # ib200 by default only where the forecast needs a link between hosts: a single-host forecast names none, so
        # a measured run over several hosts is compared only with the link given for them.
        inter_host=args.inter_host or ("ib200" if args.max_replicas > args.gpus_per_host else None),
        nics_per_host=args.nics_per_host or 1)
    result = predict.run(args.run_dir, args.out, scenario)
    print(predict.forecast_text(result))
    print(f"written: {args.out or args.run_dir}/prediction.csv, prediction.json, efficiency_vs_replicas.png")
    return 0


def plan_command(args) -> int:
    """predict without a run directory: the planner over the catalogue's hardware."""
    from ..planner import plan as planner, predict

    if not args.gpu or not args.per_replica_batch:
        raise ConfigError("without a run directory, give --gpu and --per-replica-batch (and --params or --model)")
    if args.model and args.params is not None:
        # One model: its FLOPs from --model and its gradient bytes from --params would describe neither.
        raise ConfigError("give --model (its parameters and FLOPs are counted) or --params (with --images-per-sec), "
                          "not both")
    if not args.max_replicas >= 1:
        raise ConfigError(f"--max-replicas must be a whole number >= 1, got {args.max_replicas}")
    params, fwd, mem = args.params, None, None
    if args.model:
        from ..planner import modelsize  # builds the Keras model: TensorFlow only when --model is given

        params, fwd, _ = modelsize.count(args.model, args.image_size)
        mem = modelsize.memory(args.model, args.image_size, args.precision)
    busbw, source = (), ""
    if args.allreduce_csv:  # the user's own GPUs measured: their bus bandwidth per GPU count
        from ..planner import comms

        measured, impl = comms.busbw_by_replicas(comms.read_allreduce_csvs(args.allreduce_csv), args.impl)
        busbw, source = tuple(sorted(measured.items())), f"{', '.join(args.allreduce_csv)}, {impl}"
    plan = planner.Plan(**filled(args, options(), PLAN), params=params, forward_flops=fwd,
                        replica_counts=args.replicas or args.replica_counts,
                        allreduce_dtype=args.allreduce_dtype or "float32", allreduce_packs=args.allreduce_packs or 1,
                        measured_busbw=busbw, measured_from=source)
    result = predict.run_plan(plan, args.out, counted=mem)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "frame"}, default=str))
    else:
        print(predict.plan_text(result))
    return 0
