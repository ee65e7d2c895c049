"""Which estimator should split a step into its parts? A known answer, simulated: rounds of the three interleaved
calls (the real step, the step without input, the step without the all-reduce) with 20 ms of compute, 5 ms of
all-reduce and 8 ms of input wait, a load that drifts from round to round (common to a round's three calls), jitter
on every call, and on a shared machine a spike (another process taking the core) on some calls. For each estimator:
the error of each part against the truth, how often truth lies within 2 of its stated errors (coverage), and how often
the breakdown wrongly says it failed or does not add up.

    python benchmarks/breakdown_estimator.py [--trials 400] [--rounds 5 9] [--input-wait-ms 8]

``--input-wait-ms 0``: input that never makes the step wait (cached, or prefetched far enough ahead: the common case),
a part whose truth is zero: how often noise alone makes it come out negative beyond its errors, so that the breakdown
says it failed ("a part failed" below, apart from "other" beyond its errors: "not adding up").
"""

from __future__ import annotations

import argparse

import numpy as np

from tftoolkit.measure import breakdown as measure

TRUTH = {"compute": 0.020, "all-reduce": 0.005, "input wait": 0.008}


def rounds(rng, n, spike_p, truth=TRUTH):
    drift = rng.uniform(0, 0.006, n)[:, None]
    base = np.array([sum(truth.values()), truth["compute"] + truth["all-reduce"], truth["compute"]])
    t = base + drift + rng.normal(0, 0.0005, (n, 3))
    t += (rng.random((n, 3)) < spike_p) * rng.uniform(0.005, 0.030, (n, 3))  # another process took the core
    return t[:, 0], t[:, 1], t[:, 2]


def means(a, b, c, rng):
    """The alternative: means of per-round differences (add up exactly; no residual), bootstrap errors."""
    x = np.stack([c, b - c, a - b], 1)
    boot = x[rng.integers(0, len(a), (1000, len(a)))].mean(1)
    return x.mean(0), boot.std(0, ddof=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--rounds", type=int, nargs="+", default=[5, 9])
    p.add_argument("--input-wait-ms", type=float, default=TRUTH["input wait"] * 1e3,
                   help="the input wait's true length (0: input that never makes the step wait)")
    args = p.parse_args()
    if args.trials < 1 or min(args.rounds) < 2 or not args.input_wait_ms >= 0:
        p.error("--trials must be at least 1, --rounds at least 2 each and --input-wait-ms at least 0")
    given = {**TRUTH, "input wait": args.input_wait_ms / 1e3}
    names = list(given)
    truth = np.array([given[k] for k in names])
    print(f"{'spikes':>6} {'rounds':>6} {'estimator':>9} | " + " | ".join(f"{k:>10} err ms, cover" for k in names)
          + " | a part failed | not adding up")
    for spike_p in (0.0, 0.1, 0.25):
        for n in args.rounds:
            rng = np.random.default_rng(0)
            med_err, med_cov, mean_err, mean_cov, failed, apart = [], [], [], [], 0, 0
            for _ in range(args.trials):
                a, b, c = rounds(rng, n, spike_p, given)
                s = measure.split(a, b, c)
                est = np.array([s.compute.raw, s.allreduce.raw, s.input_wait.raw])
                se = np.array([s.compute.uncertainty, s.allreduce.uncertainty, s.input_wait.uncertainty])
                med_err.append(est - truth)
                med_cov.append(np.abs(est - truth) <= measure.NOISE_SIGMAS * se)
                failed += bool(s.failed) or s.compute_beyond_step
                apart += not s.adds_up and not (s.failed or s.compute_beyond_step)
                m, mse = means(a, b, c, rng)
                mean_err.append(m - truth)
                mean_cov.append(np.abs(m - truth) <= measure.NOISE_SIGMAS * mse)
            for label, err, cov, b_ in (("median", med_err, med_cov,
                                         f"{failed / args.trials:>13.1%} | {apart / args.trials:.1%}"),
                                        ("mean", mean_err, mean_cov, f"{'-':>13} | -")):
                rms = np.sqrt(np.mean(np.square(err), 0)) * 1e3
                cover = np.mean(cov, 0)
                print(f"{spike_p:>6.2f} {n:>6} {label:>9} | " + " | ".join(
                    f"{r:>10.2f}      {c:>5.0%}" for r, c in zip(rms, cover)) + f" | {b_}")


if __name__ == "__main__":
    main()
