"""tftoolkit find-lr, find-batch, advise and predict: how to set batch size, learning rate and GPU count."""

from __future__ import annotations

import json

from ..config import ALLREDUCE_DTYPES, DEFAULT_MAX_REPLICAS, SCALING_MODES
from ..errors import ConfigError
from .common import add_config_options, add_quiet, config_from_args


def add(sub) -> None:
    """The commands that say how to set batch size, learning rate and GPU count: advise, find-lr, find-batch and
    predict."""
    _add_advise(sub)
    _add_finders(sub)
    _add_predict(sub)


def _add_advise(sub) -> None:
    # links is light (no NumPy, no pandas): --help builds without the planner
    from ..science import links

    p = sub.add_parser("advise", help="recommend a global batch and GPU count from a run's measured noise scale",
                       description="Turn the gradient noise scale of a run trained with --noise-scale into a "
                                   "recommended global batch and GPU count (B_crit ~ B_simple, McCandlish et al. "
                                   "2018) and plot the steps-vs-examples trade-off. The noise scale is the ratio of "
                                   "the per-step |G|^2 and tr(Sigma) estimates averaged over the later half of the "
                                   "run, with a 90%% interval; reasons not to trust it (a run at chance, too few "
                                   "steps, an interval wider than a factor of 3) are printed before any "
                                   "recommendation and kept in advice.json (reliable, warnings). It also says at "
                                   "which GPU count the host's input becomes the limit, from the run's input rate per "
                                   "core (input_limit in advice.json, input_limit.csv). Given how much a replica "
                                   "holds (--batch-find or --max-per-replica-batch), a recommended global batch "
                                   "past --max-replicas GPUs x that comes with the accumulate K and per-replica "
                                   "batch that reach it. Exit code 1 when "
                                   "there is no positive noise scale to recommend from.")
    p.add_argument("run_dir", help="run directory of a run trained with --noise-scale")
    p.add_argument("--out", help="where to write advice.json, tradeoff.csv, tradeoff.png (default: RUN_DIR)")
    p.add_argument("--per-replica-batch", type=int, help="per-replica batch to plan with (default: the run's, or "
                                                         "the memory cap if that is smaller)")
    p.add_argument("--batch-find", metavar="PATH",
                   help="find-batch's batch_find.json (or the --out folder holding it): its max_per_replica_batch is "
                        "the memory cap, the most a replica holds. When the critical batch asks for more GPUs than "
                        "--max-replicas, the recommendation reaches it anyway as per-replica batch (at most the cap) x "
                        "GPUs x accumulate K, and says which K (advice.json: recommended.accumulate)")
    p.add_argument("--max-per-replica-batch", type=int, metavar="B",
                   help="the memory cap given directly instead of --batch-find: the largest per-replica batch that "
                        "fits on the GPUs you will train on")
    p.add_argument("--interconnect", help="also predict time to the same loss over this link: "
                                          + ", ".join(links.PRESETS) + " or NAME=GBps[:latency_us]")
    p.add_argument("--inter-host", default="ib200", help="link between hosts for the time prediction (default: ib200)")
    _add_layout(p)
    _add_host_cores(p)
    p.set_defaults(func=advise_command)


def _add_finders(sub) -> None:
    # choices is light (no NumPy, no pandas): --help builds without the finders
    from ..science import choices

    for name, fn, helptext in (("find-lr", find_lr_command, "exponential learning-rate sweep under the strategy"),
                               ("find-batch", find_batch_command, "largest per-replica batch that fits in device memory")):
        p = sub.add_parser(name, help=helptext, description=helptext + " (see tftoolkit.finders).")
        p.add_argument("--out", required=True, help="directory for the finder's table, JSON and figure")
        add_quiet(p)
        if name == "find-lr":
            p.add_argument("--lr-min", type=float, default=choices.LR_MIN, help=f"first LR (default: {choices.LR_MIN:g})")
            p.add_argument("--lr-max", type=float, default=choices.LR_MAX, help=f"last LR (default: {choices.LR_MAX:g})")
            p.add_argument("--lr-steps", type=int, default=choices.LR_STEPS,
                           help=f"steps of the sweep (default: {choices.LR_STEPS})")
            p.add_argument("--blowup", type=float, default=choices.BLOWUP,
                           help=f"stop when the smoothed loss exceeds this multiple of its minimum (default: {choices.BLOWUP:g})")
        else:
            p.add_argument("--memory-limit-mb", type=float,
                           help="memory per replica in MiB; required on CPU replicas, where a batch fits while its "
                                "estimated training memory stays under it; on GPUs an extra cap on the measured peak")
            p.add_argument("--max-batch", type=int, default=choices.MAX_BATCH,
                           help=f"stop doubling here (default: {choices.MAX_BATCH})")
            p.add_argument("--target-global-batch", type=int, metavar="G",
                           help="also say how to train at global batch G, more than the replicas may hold in one pass: "
                                "the largest per-replica batch b that fits with G = b x replicas x K for a whole K, "
                                "and that K (--accumulate: micro-batches summed per optimizer step). G must be a multiple "
                                "of the replicas, or of --per-replica-batch x replicas when --per-replica-batch is "
                                "given (then only K is chosen). On CPU replicas the memory estimate counts the "
                                "gradient sum accumulation adds")
        add_config_options(p, skip=FINDER_SKIP[name])
        p.set_defaults(func=fn)


def _add_predict(sub) -> None:
    # choices is light (no NumPy, no pandas): --help builds without the planner
    from ..science import choices

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
    p.add_argument("run_dir", nargs="?",
                   help="measured run directory (summary.json with compute_time_s or a 1-replica step_time_s); "
                        "without one, forecast from --gpu and --params/--model (the catalogue's hardware)")
    _add_plan_options(p)
    p.add_argument("--out", help="where to write prediction.csv/json and figures (default: RUN_DIR)")
    _add_link_options(p)
    p.add_argument("--mode", choices=SCALING_MODES, default="weak",
                   help="weak: keep the per-replica batch; strong: keep the global batch (default: weak)")
    p.add_argument("--devices", choices=choices.DEVICES, default="dedicated",
                   help="dedicated: one device per replica (GPUs); shared: replicas share the host's cores "
                        "(CPU-simulated replicas) (default: dedicated)")
    _add_step_options(p)
    _add_layout(p)
    p.add_argument("--nics-per-host", type=int, help="NICs per host for the inter-host link (default: 1, or the "
                                                     "system's)")
    p.add_argument("--measured", nargs="+",
                   help="run directories or scaling.csv to compare the prediction with, each on the hosts it ran on: "
                        "a summary.json's or table's hosts and gpus_per_host where written, else a multi-worker run's "
                        "workers (one per host), else whole hosts of --gpus-per-host; over several hosts the "
                        "comparison takes --inter-host (refused when none is given)")
    p.add_argument("--compute-ms", type=float, metavar="MS",
                   help="the compute of one forward/backward pass on one GPU at the run's per-replica batch (with "
                        "accumulation, of one micro-batch), in ms, instead of the run's own: needed to forecast "
                        "GPUs from a run on CPU-simulated replicas (refused otherwise: a "
                        "GPU computes far faster, so communication would weigh more than such a forecast says)")
    _add_host_cores(p)
    p.set_defaults(func=predict_command)


def _add_link_options(p) -> None:
    """predict's links: inside a host, between hosts, and measured all-reduce tables."""
    from ..science import links

    p.add_argument("--interconnect", help="comma-separated links inside a host: " + ", ".join(links.PRESETS)
                                          + " or NAME=GBps[:latency_us] (default: all intra-host presets, or none "
                                            "with --allreduce-csv)")
    p.add_argument("--inter-host", help="link between hosts (default: ib200 with a run directory when "
                                        "--max-replicas spans several hosts, the system's NIC without)")
    p.add_argument("--allreduce-csv", nargs="+", help="allreduce.csv file(s) or their directories from `tftoolkit "
                                                      "bench allreduce` (one per GPU count): with a run directory, "
                                                      "fit bandwidth and latency to them; with --gpu, their bus "
                                                      "bandwidth per GPU count replaces the catalogue's link, "
                                                      "extrapolated past the largest count measured")
    p.add_argument("--impl", help="all-reduce implementation to fit in the CSV (default: the fastest)")


def _add_step_options(p) -> None:
    """predict's model of a step: the all-reduce's overlap, dtype and packs, accumulation, the exchange inside a
    host and the straggler's wait."""
    from ..science import choices

    p.add_argument("--overlap", type=float, help="fraction of the all-reduce hidden behind the backward pass, at "
                                                 "most that pass (2/3 of one micro-step's compute) (default: none with "
                                                 "one pack, as this toolkit's step; modelled from --allreduce-packs "
                                                 "with several)")
    p.add_argument("--allreduce-dtype", choices=ALLREDUCE_DTYPES,
                   help="dtype the gradients travel in: the run's gradient bytes are converted from its own dtype "
                        "(summary allreduce_dtype; float32 for older runs) by bytes per element, so bfloat16 and "
                        "float16 move half of float32's (default: the run's)")
    p.add_argument("--allreduce-packs", type=int, metavar="P",
                   help="all-reduce in P packs of equal bytes, last layers first, each its own call (so the latency is "
                        "paid P times). Without --overlap the first P-1 are modelled, not measured, to go while the "
                        "backward pass runs and the last after it: hidden = (P-1)/P x min(all-reduce, backward pass); "
                        "nothing is hidden with --accumulate > 1, where the step all-reduces after its micro-batches "
                        "(default: the run's)")
    p.add_argument("--accumulate", type=int, metavar="K",
                   help="micro-batches per replica per optimizer step: a step is modelled as K x the compute of one "
                        "micro-batch (the run's step compute / its own accumulate) plus one all-reduce, so "
                        "communication's share falls as K grows; global batch = per-replica batch x replicas x K "
                        "(default: the run's)")
    p.add_argument("--algorithm", choices=choices.ALGORITHMS, default="ring",
                   help="the exchange inside a host: ring (NCCL 2+, Horovod, the collective ops; this toolkit's own "
                        "step), tree (NCCL's double binary tree), star (reduce_to_one: CPU replicas, GPUs without "
                        "NCCL), hierarchical-copy (HierarchicalCopyAllReduce: a star in each half, the halves' main "
                        "devices exchanging); without a run directory also ring-in-order (NCCL 1.x: one ring in device "
                        "order), host (the variables in host memory: a parameter server on the CPU, "
                        "CentralStorageStrategy) and parameter-server (variables spread over the GPUs, the largest "
                        "tensor's holder the bottleneck: tf_cnn_benchmarks' default). 16-bit gradient compaction is "
                        "--allreduce-dtype float16 (default: ring)")
    p.add_argument("--straggler", type=float, metavar="SIGMA",
                   help="a replica's compute's variation from step to step (coefficient of variation): a synchronous "
                        "step waits for the slowest of N, compute x (1 + SIGMA x E[max of N normals]) (default: the "
                        "value fitted to the published validation rows, on dedicated devices; none with --devices "
                        "shared)")


def _add_plan_options(p) -> None:
    g = p.add_argument_group("forecast without a run directory (hardware from tftoolkit/catalogue)")
    g.add_argument("--gpu", help="GPU name as nvidia-smi prints it, or an alias (v100, a100, h100-sxm, rtx-4090...)")
    g.add_argument("--params", type=int, metavar="N", help="the model's parameter count")
    g.add_argument("--model", help="a registered model or keras.applications name, whole with its classifier head as "
                                   "published rows ran it (NAME_headless: without it): parameters, FLOPs and training "
                                   "memory counted; not with --params")
    g.add_argument("--image-size", type=int, default=224,
                   help="input size for --model's count, 1 to 4096 pixels (default: 224)")
    g.add_argument("--per-replica-batch", type=int, help="examples per GPU per step")
    g.add_argument("--images-per-sec", type=float, metavar="R",
                   help="a measured or published single-GPU rate at that batch (default: from FLOPs over the peak)")
    g.add_argument("--precision", choices=("float32", "mixed_float16", "mixed_bfloat16"), default="float32",
                   help="Keras policy; float32 runs as TF32 on Ampere and later, as TensorFlow does by default")
    g.add_argument("--replica-counts", default="1,2,4,8", help="GPU counts to forecast (default: 1,2,4,8)")
    g.add_argument("--replicas", help="one GPU count (a list is --replica-counts)")
    g.add_argument("--overhead-ms", type=float, metavar="MS",
                   help="fixed cost of each multi-GPU step, ms (default: the value fitted to the published "
                        "validation rows together with --straggler's)")
    g.add_argument("--json", action="store_true", help="print the forecast as JSON on stdout")


def _add_layout(p) -> None:
    """--max-replicas and --gpus-per-host, with one default each for advise and predict."""
    from ..science import choices

    p.add_argument("--max-replicas", type=int, default=DEFAULT_MAX_REPLICAS,
                   help=f"most GPUs to consider (default: {DEFAULT_MAX_REPLICAS})")
    p.add_argument("--gpus-per-host", type=int, default=choices.DEFAULT_GPUS_PER_HOST,
                   help="GPUs in each host: counts past it are whole hosts joined by --inter-host "
                        f"(default: {choices.DEFAULT_GPUS_PER_HOST})")


def _add_host_cores(p) -> None:
    p.add_argument("--host-cores", type=int, metavar="N",
                   help="cores of each GPU host (and of each tf.data service worker) when saying at which GPU count "
                        "input becomes the limit, from the run's input rate per core (default: the run's own host, "
                        "input_cores x workers)")


def advise_command(args) -> int:
    from ..science import advise

    result = advise.advise(args.run_dir, args.out, per_replica_batch=args.per_replica_batch,
                           max_replicas=args.max_replicas, interconnect=args.interconnect, inter_host=args.inter_host,
                           host_cores=args.host_cores, max_per_replica_batch=args.max_per_replica_batch,
                           batch_find=args.batch_find, gpus_per_host=args.gpus_per_host)
    print(advise.advice_text(result))
    print(f"written: {args.out or args.run_dir}/advice.json, tradeoff.csv"
          + (", input_limit.csv" if result["input_frame"] is not None else "")
          + (", tradeoff.png" if result["recommended"] is not None else ""))
    return 0 if result["recommended"] is not None else 1


# Training options a finder does not use, so it does not offer them (an option taken and ignored is a promise
# broken): neither trains to a length (--lr-steps, one step per trial) nor checkpoints, profiles, measures or
# evaluates; the LR sweep replaces the schedule; find-batch runs one step on a batch of its own.
_NOT_FOR_FINDERS = ("steps", "epochs", "checkpoint_every", "profile_steps", "noise_scale", "measure",
                    "eval_every_epoch", "timing_warmup_steps", "divergence_factor", "warmup_epochs", "schedule",
                    "base_lr", "data_placement", "workers", "input_sharding")
FINDER_SKIP = {"find-lr": _NOT_FOR_FINDERS,
               "find-batch": _NOT_FOR_FINDERS + ("lr_rule", "base_batch", "augment", "last_batch", "steps_per_loop",
                                                 "accumulate")}


def find_lr_command(args) -> int:
    from ..science import finders

    r = finders.find_lr(config_from_args(args, skip=FINDER_SKIP["find-lr"]), args.out, lr_min=args.lr_min, lr_max=args.lr_max, steps=args.lr_steps,
                        blowup=args.blowup, quiet=args.quiet)
    if r["suggested_lr"] == r["suggested_lr"]:
        print(f"suggested LR {r['suggested_lr']:.4g} for global batch {r['global_batch']} ({r['suggestion']}); "
              f"as --base-lr under the {r['lr_rule']} rule: {r['suggested_base_lr']:.4g}; {r['stop_reason']}")
    else:
        print(f"no LR suggested: {r['suggestion']}; {r['stop_reason']}")
    print(f"written: {args.out}/lr_find.csv, lr_find.json, lr_find.png")
    return 0


def find_batch_command(args) -> int:
    from ..science import finders

    r = finders.find_batch(config_from_args(args, skip=FINDER_SKIP["find-batch"]), args.out, memory_limit_mb=args.memory_limit_mb,
                           max_batch=args.max_batch, quiet=args.quiet, target_global_batch=args.target_global_batch)
    print(f"largest per-replica batch that fits: {r['max_per_replica_batch']}"
          f"{' (the --max-batch cap)' if r['capped_at_max_batch'] else ''}; global batch "
          f"{r['max_global_batch']} on {r['replicas']} replica(s); criterion: {r['criterion']}")
    if "target" in r:
        t = r["target"]
        print(f"global batch {t['global_batch']} = per-replica batch {t['per_replica_batch']} x {t['replicas']} "
              f"replica(s) x accumulate {t['accumulate']}: train with {t['train_with']} ({t['memory']})")
    print(f"written: {args.out}/batch_find.csv, batch_find.json, batch_find.png")
    return 0


def predict_command(args) -> int:
    from ..science import predict

    if args.replicas is not None and "," in str(args.replicas):
        raise ConfigError(f"--replicas is one GPU count; for a list write --replica-counts {args.replicas}")
    if args.run_dir is None:
        return plan_command(args)
    scenario = predict.Scenario(
        # ib200 by default only where the forecast needs a link between hosts: a single-host forecast names none, so
        # a measured run over several hosts is compared only with the link given for them.
        interconnects=args.interconnect,
        inter_host=args.inter_host or ("ib200" if args.max_replicas > args.gpus_per_host else None),
        allreduce_csv=args.allreduce_csv,
        impl=args.impl, mode=args.mode, devices=args.devices, overlap=args.overlap, max_replicas=args.max_replicas,
        gpus_per_host=args.gpus_per_host, nics_per_host=args.nics_per_host or 1, measured=args.measured,
        straggler=args.straggler,
        algorithm=args.algorithm, compute_ms=args.compute_ms, host_cores=args.host_cores,
        allreduce_dtype=args.allreduce_dtype, allreduce_packs=args.allreduce_packs, accumulate=args.accumulate)
    result = predict.run(args.run_dir, args.out, scenario)
    print(predict.forecast_text(result))
    print(f"written: {args.out or args.run_dir}/prediction.csv, prediction.json, efficiency_vs_replicas.png")
    return 0


def plan_command(args) -> int:
    """predict without a run directory: the planner over the catalogue's hardware."""
    from ..science import planner, predict

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
        from ..science import modelsize  # builds the Keras model: TensorFlow only when --model is given

        params, fwd, _ = modelsize.count(args.model, args.image_size)
        mem = modelsize.memory(args.model, args.image_size, args.precision)
    busbw, source = (), ""
    if args.allreduce_csv:  # the user's own GPUs measured: their bus bandwidth per GPU count
        from ..science import comms

        measured, impl = comms.busbw_by_replicas(comms.read_allreduce_csvs(args.allreduce_csv), args.impl)
        busbw, source = tuple(sorted(measured.items())), f"{', '.join(args.allreduce_csv)}, {impl}"
    plan = planner.Plan(gpu=args.gpu, per_replica_batch=args.per_replica_batch, params=params, model=args.model,
                        gpus_per_host=args.gpus_per_host, interconnect=args.interconnect, inter_host=args.inter_host,
                        nics_per_host=args.nics_per_host, images_per_sec=args.images_per_sec,
                        compute_ms=args.compute_ms, forward_flops=fwd, precision=args.precision,
                        replica_counts=args.replicas or args.replica_counts, algorithm=args.algorithm,
                        allreduce_dtype=args.allreduce_dtype or "float32", allreduce_packs=args.allreduce_packs or 1,
                        overlap=args.overlap, overhead_ms=args.overhead_ms, straggler=args.straggler,
                        measured_busbw=busbw, measured_from=source)
    result = predict.run_plan(plan, args.out, counted=mem)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "frame"}, default=str))
    else:
        print(predict.plan_text(result))
    return 0
