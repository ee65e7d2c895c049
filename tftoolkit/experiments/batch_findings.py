"""The batch-size and LR findings of a report, checked against the runs they come from (findings.all_findings calls
``batch_and_lr``): the best LR rule per global batch, where no rule is better than another beyond the runs' spread;
how far linear scaling holds (Goyal et al. 2017), or that the sweep cannot separate the rules; the measured gradient
noise scale (McCandlish et al. 2018) with its interval and training phase, and whether the runs agree with it as the
end of the linear regime. File readers only: no TensorFlow.
"""

from __future__ import annotations

import math

import pandas as pd

from .report import results

# Accuracy points (of 100) within which a large batch "holds" the small batch's accuracy (about the run-to-run
# spread of these short CPU runs).
HOLDS_WITHIN = 5.0


def _label(row) -> str:
    rule = str(row.get("lr_rule", "?"))
    warm = row.get("warmup_epochs")
    warmed = warm is not None and not (isinstance(warm, float) and math.isnan(warm)) and float(warm) > 0
    return f"{rule}" + (f" + {float(warm):g}-epoch warmup" if warmed else "")


def _spread_label(g: pd.DataFrame) -> str:
    top = g["val_accuracy"].max()
    # Runs within HOLDS_WITHIN of the best tie: naming one of them "best" would claim a difference larger than the
    # run-to-run spread shows.
    tied = g[g["val_accuracy"] >= top - HOLDS_WITHIN / 100]
    labels = list(dict.fromkeys(_label(r) for _, r in tied.sort_values("val_accuracy", ascending=False).iterrows()))
    if len(labels) == 1:
        return f"{labels[0]} ({top:.0%})"
    if len(labels) == len({_label(r) for _, r in g.iterrows()}):
        low = g["val_accuracy"].min()
        return (f"no rule better than another (all {top:.0%})" if f"{low:.0%}" == f"{top:.0%}" else
                f"no rule better than another (all within {HOLDS_WITHIN:g} points: {low:.0%}-{top:.0%})")
    return f"a tie between {', '.join(labels)} ({tied['val_accuracy'].min():.0%}-{top:.0%})"


def batch_and_lr(res: results.Results) -> list[str]:
    _, _, runs = results.batch_frames(res)
    if runs.empty or not {"global_batch", "val_accuracy"} <= set(runs.columns):
        return []
    ok = results.finished(runs).dropna(subset=["val_accuracy"])
    if ok.empty:
        return []
    parts = [f"{int(batch)}: {_spread_label(g)}" for batch, g in ok.groupby("global_batch")]
    out = ["**Best LR rule per global batch** (final validation accuracy): " + "; ".join(parts) + "."]
    noise = _noise_scale(res)
    out += _linear_regime(ok, noise[1] if noise else None)
    if noise:
        out.append(noise[0])
    return out


def _cannot_separate(ok: pd.DataFrame, batches: list[int]) -> bool:
    """Every batch past the smallest ran more than one rule, and at each of them the rules' accuracies lie within
    HOLDS_WITHIN points of one another: this sweep cannot tell the rules apart."""
    several = [ok[ok["global_batch"] == b] for b in batches[1:]]
    several = [g for g in several if g["lr_rule"].nunique() > 1 or g.get("warmup_epochs", pd.Series()).nunique() > 1]
    return bool(several) and all((g["val_accuracy"].max() - g["val_accuracy"].min()) * 100 <= HOLDS_WITHIN
                                 for g in several)


def _linear_regime(ok: pd.DataFrame, noise: tuple | None = None) -> list[str]:
    """How far linear scaling (with warmup, where the sweep ran it) keeps the smallest batch's accuracy (Goyal et al.
    2017), checked against the runs: the first batch where it no longer holds; that the sweep cannot separate the rules
    when every rule holds alike; and, when every batch holds, what the measured noise scale ``noise`` (value, lo, hi)
    says, or that the runs contradict it (McCandlish et al. 2018)."""
    if "lr_rule" not in ok.columns:
        return []
    batches = sorted(int(b) for b in ok["global_batch"].unique())
    if len(batches) < 2:
        return []
    ref_batch = batches[0]
    ref = ok[ok["global_batch"] == ref_batch]["val_accuracy"].max()
    warm = ok.get("warmup_epochs", pd.Series(0.0, index=ok.index)).fillna(0.0) > 0
    lin, name = ok[(ok["lr_rule"] == "linear") & warm], "Linear scaling with warmup"
    if lin.empty:
        lin, name = ok[ok["lr_rule"] == "linear"], "Linear scaling (no warmup)"
    if lin.empty:
        return []
    held, broke = [], None
    for b in batches[1:]:
        acc = lin[lin["global_batch"] == b]["val_accuracy"].max()
        if isinstance(acc, float) and math.isnan(acc):
            continue
        if (ref - acc) * 100 <= HOLDS_WITHIN:
            held.append((b, acc))
        elif broke is None:
            broke = (b, acc)
    none = ok[ok["lr_rule"] == "none"]
    sentences = []
    if broke is None and _cannot_separate(ok, batches):
        top = ok["val_accuracy"].max()
        sentences.append(f"**The sweep cannot separate the LR rules:** at every batch up to {batches[-1]} every rule "
                         f"ran came within {HOLDS_WITHIN:g} points of the others (best {top:.0%}, batch {ref_batch}: "
                         f"{ref:.0%}), so no rule is shown to hold better than another; a harder task, fewer epochs "
                         "or larger batches would tell them apart.")
    elif held:
        b, acc = held[-1]
        vs_none = none[none["global_batch"] == b]["val_accuracy"].max()
        gap = f", {(acc - vs_none) * 100:.0f} points above no scaling ({vs_none:.0%})" if vs_none == vs_none else ""
        at_b = ok[ok["global_batch"] == b]
        best = at_b.loc[at_b["val_accuracy"].idxmax()]
        beside = (f"; the best run there was {_label(best)} ({best['val_accuracy']:.0%})"
                  if best["val_accuracy"] > acc and _label(best) not in name.lower() else "")
        sentences.append(f"**{name} holds** up to batch {b} ({b // ref_batch}x the smallest): "
                         f"{acc:.0%} against {ref:.0%} at batch {ref_batch}{gap}, at the same number of epochs{beside}.")
    if broke is not None:
        b, acc = broke
        sentences.append(f"**The regime ends** at batch {b}: {name.lower()} reaches {acc:.0%}, "
                         f"{(ref - acc) * 100:.0f} points below batch {ref_batch}, in {b // ref_batch}x fewer steps.")
    elif held or sentences:
        sentences.append(f"**The regime reaches the largest batch run** ({batches[-1]}): no batch here goes past it"
                         + (_against_noise(batches[-1], noise) if noise else "."))
    return sentences


def _against_noise(largest: int, noise: tuple) -> str:
    """The regime's reach checked against the noise scale (value, lo, hi): past its interval, the runs contradict it as
    the regime's end; inside it, they neither confirm nor contradict it; below it, it says where the end should be."""
    value, lo, hi = noise
    interval = f" [{lo:.0f}-{hi:.0f}]" if lo == lo and hi == hi else ""
    figure = f"B_simple ~ {value:.0f}{interval}"
    top = hi if hi == hi else value
    low = lo if lo == lo else value
    if largest > top:
        return (f". The runs contradict the noise scale as the regime's end: batch {largest} is {largest / value:.1f}x "
                f"past the measured {figure} and still held. The noise scale says where a bigger batch starts to need "
                "more examples for the same loss; these runs, at the same epochs, do not show that cost.")
    if largest >= low:
        return (f". The largest batch lies within the measured noise scale's interval ({figure}): the runs neither "
                "confirm nor contradict it as the regime's end.")
    return (f"; the measured noise scale ({figure}) says where it should end: past it a bigger batch needs "
            "proportionally more epochs for the same loss.")


def _noise_scale(res: results.Results) -> tuple[str, tuple] | None:
    """The runs' noise scale (noise_scale.robust_estimate, as summary.json records it) from the reliable runs only, with
    its interval and training phase: one run's figure with its 90% interval; several runs' median with their range, and,
    when their intervals do not overlap, each run's figure, for no one figure stands for them. Returns (the sentence,
    (value, lo, hi)), lo-hi the widest of the runs' intervals; when every measured run is unreliable, a sentence that
    says so and no figure."""
    if res.runs.empty or "noise_scale" not in res.runs.columns:
        return None
    ns = res.runs.dropna(subset=["noise_scale"])
    if "noise_scale_reliable" in ns.columns:
        measured = len(res.runs[res.runs["noise_scale_reliable"].notna()])
        ns = ns[ns["noise_scale_reliable"].fillna(False).astype(bool)]
        if ns.empty and measured:
            return (f"**Gradient noise scale:** measured in {measured} run(s), reliable in none (too few steps, a "
                    "run at chance, or an interval wider than a factor of 3: each run's noise_scale_warnings say "
                    "which): no critical batch to compare with.", None)
    ns = ns[ns["noise_scale"] > 0]
    if ns.empty:
        return None
    nan = pd.Series(math.nan, index=ns.index)
    los = pd.to_numeric(ns.get("noise_scale_interval_lo", nan), errors="coerce")
    his = pd.to_numeric(ns.get("noise_scale_interval_hi", nan), errors="coerce")
    value, n = float(ns["noise_scale"].median()), len(ns)

    def one(i) -> str:
        at = f" at batch {int(ns.loc[i, 'global_batch'])}" if "global_batch" in ns.columns else ""
        band = f" [{los[i]:.0f}-{his[i]:.0f}]" if los[i] == los[i] and his[i] == his[i] else ""
        return f"{ns.loc[i, 'noise_scale']:.0f}{band}{at}"

    known = los.notna() & his.notna()
    lo, hi = (float(los.min()), float(his.max())) if known.all() else (math.nan, math.nan)
    if n == 1:
        i = ns.index[0]
        band = f", 90% interval {los[i]:.0f}-{his[i]:.0f}" if known.all() else ""
        at = f" at batch {int(ns.loc[i, 'global_batch'])}" if "global_batch" in ns.columns else ""
        head = f"B_simple ~ {value:.0f} examples{band} (1 run{at})"
    elif known.all() and los.max() > his.min():
        head = (f"the {n} runs disagree: {', '.join(one(i) for i in ns.index)} (90% intervals), which do not overlap, "
                f"so no one figure stands for them (median {value:.0f}, range {ns['noise_scale'].min():.0f}-"
                f"{ns['noise_scale'].max():.0f}; the noise scale moves with the batch, the learning rate and the point "
                "of training)")
    else:
        head = (f"B_simple ~ {value:.0f} examples (median of {n} runs, range {ns['noise_scale'].min():.0f}-"
                f"{ns['noise_scale'].max():.0f}" + ("; their 90% intervals overlap" if known.all() else "") + ")")
    early = ns.get("noise_scale_early", pd.Series(None, index=ns.index, dtype=object))
    growing = int((early == True).sum())  # noqa: E712 - a column of True, False and None
    phase = (f" Measured while it was still growing in {growing} of {n} run(s): from early training, it understates "
             "the batch that pays off later." if growing else "")
    return (f"**Gradient noise scale:** {head}: the critical batch B_crit is about that size; batches well past it need "
            "proportionally more epochs for the same loss, which is where linear scaling stops paying (McCandlish et "
            f"al. 2018).{phase}", (value, lo, hi))
