"""tftoolkit find-lr, find-batch and advise: how to set batch size, learning rate and GPU count (predict: predict.py)."""

from __future__ import annotations

from .common import add_config_options, add_options, add_quiet, config_from_args


def add(sub) -> None:
    """The commands that say how to set batch size, learning rate and GPU count: advise, find-lr and find-batch."""
    _add_advise(sub)
    _add_finders(sub)


def _add_advise(sub) -> None:
    # links is light (no NumPy, no pandas): --help builds without the planner
    from ..planner import links

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
    from .predict import host_cores_option, layout_options  # declared once, with predict's

    add_options(p, (*layout_options(), host_cores_option()))
    p.set_defaults(func=advise_command)


def _add_finders(sub) -> None:
    # choices is light (no NumPy, no pandas): --help builds without the finders
    from ..planner import choices

    for name, fn, helptext in (("find-lr", find_lr_command, "exponential learning-rate sweep under the strategy"),
                               ("find-batch", find_batch_command, "largest per-replica batch that fits in device memory")):
        p = sub.add_parser(name, help=helptext, description=helptext + " (see tftoolkit.tuning.finders).")
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


def advise_command(args) -> int:
    from ..tuning import advise

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
                    "measure_budget", "eval_every_epoch", "timing_warmup_steps", "divergence_factor",
                    "warmup_epochs", "schedule", "base_lr", "data_placement", "workers", "input_sharding")
FINDER_SKIP = {"find-lr": _NOT_FOR_FINDERS,
               "find-batch": _NOT_FOR_FINDERS + ("lr_rule", "base_batch", "augment", "last_batch", "steps_per_loop",
                                                 "accumulate")}


def find_lr_command(args) -> int:
    from ..tuning import finders

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
    from ..tuning import finders

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
