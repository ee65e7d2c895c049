"""Which estimator should split a step into its parts? A known answer, simulated: rounds of the three interleaved
calls (the real step, the step without input, the step without the all-reduce) with 20 ms of compute, 5 ms of
all-reduce and 8 ms of input wait, a load that drifts from round to round (common to a round's three calls), jitter
on every call, and on a shared machine a spike (another process taking the core) on some calls. For each estimator:
the error of each part against the truth, how often truth lies within 2 of its stated errors (coverage), and how often
the breakdown wrongly says it failed or does not add up.

    python benchmarks/breakdown_estimator.py [--trials 400] [--rounds 5 9]
"""

from __future__ import annotations

import argparse

import numpy as np

from tftoolkit.measure import breakdown as measure

TRUTH = {"compute": 0.020, "all-reduce": 0.005, "input wait": 0.008}


def rounds(rng, n, spike_p):
    drift = rng.uniform(0, 0.006, n)[:, None]
    base = np.array([sum(TRUTH.values()), TRUTH["compute"] + TRUTH["all-reduce"], TRUTH["compute"]])
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
    args = p.parse_args()
    names = list(TRUTH)
    truth = np.array([TRUTH[k] for k in names])
    print(f"{'spikes':>6} {'rounds':>6} {'estimator':>9} | " + " | ".join(f"{k:>10} err ms, cover" for k in names)
          + " | failed or not adding up")
    for spike_p in (0.0, 0.1, 0.25):
        for n in args.rounds:
            rng = np.random.default_rng(0)
            med_err, med_cov, mean_err, mean_cov, bad = [], [], [], [], 0
            for _ in range(args.trials):
                a, b, c = rounds(rng, n, spike_p)
                s = measure.split(a, b, c)
                est = np.array([s.compute.raw, s.allreduce.raw, s.input_wait.raw])
                se = np.array([s.compute.uncertainty, s.allreduce.uncertainty, s.input_wait.uncertainty])
                med_err.append(est - truth)
                med_cov.append(np.abs(est - truth) <= measure.NOISE_SIGMAS * se)
                bad += not s.adds_up
                m, mse = means(a, b, c, rng)
                mean_err.append(m - truth)
                mean_cov.append(np.abs(m - truth) <= measure.NOISE_SIGMAS * mse)
            for label, err, cov, b_ in (("median", med_err, med_cov, f"{bad / args.trials:.0%}"),
                                        ("mean", mean_err, mean_cov, "-")):
                rms = np.sqrt(np.mean(np.square(err), 0)) * 1e3
                cover = np.mean(cov, 0)
                print(f"{spike_p:>6.2f} {n:>6} {label:>9} | " + " | ".join(
                    f"{r:>10.2f}      {c:>5.0%}" for r, c in zip(rms, cover)) + f" | {b_}")


if __name__ == "__main__":
    main()
