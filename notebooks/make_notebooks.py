"""Write the toolkit's notebooks from the cell sources below (run: python notebooks/make_notebooks.py).

The notebooks are generated so that a review reads this file, not JSON. Rules every notebook follows
(tests/test_notebooks.py checks them):
- the first code cell is tagged ``parameters`` and holds only typed, commented literal defaults (so
  ``papermill --help-notebook`` documents them); it always has ``smoke: bool`` and ``out_dir: str``;
- the code cell after it calls ``tftoolkit.init_devices`` before anything touches TensorFlow;
- every other cell is one or two package calls: no ``def`` or ``class`` (logic lives in tftoolkit/, tested);
- each notebook saves its figures (PNG + SVG under ``out_dir/figures``) and a results table into ``out_dir``;
- committed without outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
NOTEBOOK_ONLY = "notebook-only"  # the tag tftoolkit.experiments.sweep.html.write_html drops


def md(text: str, notebook_only: bool = False):
    """A Markdown cell; ``notebook_only``: left out of the HTML report pages (sweep.write_html), e.g. how to run it."""
    return new_markdown_cell(text.strip("\n"), metadata={"tags": [NOTEBOOK_ONLY]} if notebook_only else {})


def code(text: str):
    return new_code_cell(text.strip("\n"))


def params(text: str):
    return new_code_cell(text.strip("\n"), metadata={"tags": ["parameters"]})


def run_hint(name: str, extra: str = "") -> str:
    return (f"Headless: `papermill notebooks/{name}.ipynb out.ipynb -p smoke True{extra}` "
            "(any parameter below can be given with `-p NAME VALUE`; `papermill --help-notebook` lists them). "
            "Over a grid of parameters: `tftoolkit sweep SPEC.yaml --out DIR` (examples in `sweeps/`).")


NOTEBOOKS = {}

NOTEBOOKS["00_environment"] = [
    md("""
# 00 · Environment: what this machine offers for data-parallel training

First `tftoolkit doctor`: do the assumptions the toolkit's numbers rest on hold on this machine (build against
driver, visible GPUs, exact all-reduce sums, N replicas equal to one device, data on the devices, synchronised
timing, the peak FLOP/s, NVML, NCCL's transports)? Then the hardware and software report (TensorFlow build, CPU,
memory, every GPU and the interconnect between each pair), and a quick all-reduce bandwidth check on the replicas
training would use. Without GPUs the replicas are simulated as logical CPU devices sharing the host's cores: the
numbers then describe memory bandwidth, not links.

""" + run_hint("00_environment")),
    params("""
replicas: int = 4  # replicas for the all-reduce check: the first N GPUs, or N simulated CPU devices
sizes: str = "64KiB..16MiB"  # all-reduce message sizes: A..B sweeps powers of two, or a list like 4KB,1MB
impls: str = "all"  # all-reduce implementations to time: all, or a list like nccl,reduce_to_one
repeats: int = 10  # timed repeats per size (the median is reported)
smoke: bool = False  # shrink to a < 1 minute check on 2 CPU cores
out_dir: str = "runs/00_environment"  # where env.json, allreduce.csv and figures/ go
"""),
    code("""
%matplotlib inline
import tftoolkit
from tftoolkit import fileio
from tftoolkit.experiments import notebook as nb
from tftoolkit.experiments.report import figures, results
from tftoolkit.measure import allreduce, doctor, hardware
from tftoolkit.measure.allreduce import bench as allreduce_bench

out = nb.start(out_dir)
tftoolkit.init_devices(replicas)  # first: TensorFlow fixes its device list when it initialises
"""),
    md("""
## Doctor

Each check: pass, fail or skip (with the reason), the figure it measured, and what to do when it fails. Smoke
mode leaves out the two that train and time (equivalence, peak); `tftoolkit doctor` runs them all.
"""),
    code("""
checks = doctor.run(replicas, only=doctor.QUICK if smoke else None)
fileio.write_json(out / "doctor.json", {"checks": [c.as_dict() for c in checks]})
print(doctor.format_table(checks))
"""),
    md("## Hardware, software and topology"),
    code("""
env = hardware.collect()
fileio.write_json(out / "env.json", env)
print(hardware.format_report(env))
"""),
    md("""
## Quick all-reduce check

Bus bandwidth follows nccl-tests (`busbw = algbw × 2(n−1)/n`), so it compares with a link's rated bandwidth.
Implementations that cannot run here (NCCL without GPUs) are listed as skipped with the reason.
"""),
    code("""
table = allreduce_bench.bench(replicas, "4KiB,64KiB" if smoke else sizes, impls, repeats=2 if smoke else repeats,
                             models=() if smoke else ("small_cnn",), max_chain=2 if smoke else allreduce.MAX_CHAIN, out=out)
table
"""),
    code("""
res = results.load([out])
figures.figure(res, "busbw", out / "figures")
"""),
    code("""
figures.figure(res, "allreduce_time", out / "figures")
"""),
    md("Written: `doctor.json`, `env.json`, `allreduce.csv`, `bench.json` and `figures/` in `out_dir`."),
]

NOTEBOOKS["01_data_parallel_scaling"] = [
    md("""
# 01 · Data-parallel scaling: how much faster on N replicas?

The same training at 1, 2, 4 … replicas on the 16000-image `shapes16k` set. **Weak scaling** keeps the
per-replica batch (the global batch grows with N: the usual data-parallel use); **strong scaling** keeps the
global batch, so each replica's share shrinks. Throughput is plotted against the ideal line (N × the
smallest count's rate), with the efficiency, where each step's time goes (compute / gradient all-reduce /
input wait), how many images each replica trained on, and the hardware monitor's trace of the largest run.

On CPU-simulated replicas all replicas share the host's cores, so throughput cannot grow with N there: the
notebook then demonstrates the method; run it on GPUs for the real curve.

""" + run_hint("01_data_parallel_scaling", " -p replicas '[1, 2]'")),
    params("""
replicas: list = [1, 2, 4]  # replica counts to compare: the first N GPUs, or N simulated CPU devices
mode: str = "weak"  # weak: keep the per-replica batch; strong: keep the global batch
per_replica_batch: int = 64  # examples per replica per step (weak scaling: the global batch is this x N)
global_batch: int = 0  # strong scaling's fixed global batch (0: per_replica_batch x the smallest N)
model: str = "small_cnn"  # registered model name, or package.module:function returning a Keras model
dataset: str = "shapes16k"  # shapes16k (made on first use), synthetic, or a folder of images / TFRecords
steps: int = 150  # optimizer steps per run; the first timing_warmup_steps are not timed (from ~100 steps the breakdown fits measure_budget)
timing_warmup_steps: int = 10  # steps left out of throughput (tracing, autotuning)
steps_per_loop: int = 10  # training steps per tf.function call
measure: bool = True  # time compute, all-reduce and input wait separately (a few extra loops per run)
measure_budget: float = 0.1  # the most of each run's wall time measuring may take; a run too short for the breakdown says "not measured"
seed: int = 0  # seed for weights and data order
data_service: str = ""  # HOST:PORT of a tf.data service (tftoolkit data-service start) to read the input from; "": local
loss: str = ""  # a Keras loss name for a model of another task (mse, ...); "": classification, or the model's own
metrics: str = ""  # comma-separated Keras metric names, each reported as val_<name>
smoke: bool = False  # shrink to a < 1 minute check on 2 CPU cores (synthetic data, a few steps)
out_dir: str = "runs/01_data_parallel_scaling"  # where runs/, scaling.csv and figures/ go
"""),
    code("""
%matplotlib inline
import tftoolkit
from tftoolkit.experiments import notebook as nb, scale
from tftoolkit.experiments.report import figures, results, tables

replicas = nb.smoke_values(nb.as_list(replicas, int, "replicas"), smoke, "replicas")  # -p passes '[1, 2]' as text
tftoolkit.init_devices(max(replicas))  # first: TensorFlow fixes its device list when it initialises
out = nb.start(out_dir)
"""),
    code("""
config = nb.training_config(smoke, model=model, dataset=dataset, per_replica_batch=per_replica_batch,
                            global_batch=global_batch, steps=steps, timing_warmup_steps=timing_warmup_steps,
                            steps_per_loop=steps_per_loop, measure=measure, seed=seed, data_service=data_service,
                            loss=loss, metrics=metrics, measure_budget=measure_budget)
config["measure"] = measure  # smoke keeps it: where each step's time goes is half of what this notebook shows
nb.prepare_data(config["dataset"])
config
"""),
    md("## Train at each replica count"),
    code("""
table = scale.scale(config, replicas, out, mode=mode)
table
"""),
    md("""
## Throughput and efficiency

Error bars: the standard error of the mean images/sec over timed steps. Percentages: scaling efficiency.
"""),
    code("""
res = results.load([out])
figures.figure(res, "throughput", out / "figures")
"""),
    code("""
figures.figure(res, "efficiency", out / "figures")
"""),
    md("""
## Where each step's time goes

Compute is the step with the gradient all-reduce removed; the all-reduce is what the full step costs on top;
input wait is the training step's time beyond the same step on a batch already in memory.
"""),
    code("""
figures.figure(res, "step_breakdown", out / "figures")
"""),
    md("## Images per replica (equal bars: every replica trained on the same share)"),
    code("""
figures.figure(res, "images_per_replica", out / "figures")
"""),
    md("## Hardware monitor: the largest run (GPUs, or the host's CPUs for simulated replicas)"),
    code("""
figures.figure(res, "monitor", out / "figures")
"""),
    code("""
tables.save_tables(res, out)
"""),
]

NOTEBOOKS["02_batch_and_lr_scaling"] = [
    md("""
# 02 · Batch size and learning-rate scaling

Global batch × LR rule × warmup, at the same number of epochs. The learning rate is `base_lr` at `base_batch`
and scales with the global batch by the rule: **none** (unchanged), **linear** (× batch/base_batch, Goyal et al.
2017) or **sqrt** (× √(batch/base_batch), the usual advice for Adam-type optimisers); warmup ramps from `base_lr`
to the scaled LR. The defaults reproduce Goyal et al.'s result with their optimiser, momentum SGD: from the
smallest batch to 8x it, the linear rule with warmup keeps the accuracy while no scaling falls behind; the
largest batch is about where the regime ends on this set (at 16x it no longer holds: BENCHMARKS.md); the report's
findings check that against each run's measured noise scale and its interval. Curves are drawn against epochs, the axis on which runs with different batches saw the
same data; diverged runs are marked with a red ✕ where they stopped, never hidden. Every run also measures the
gradient noise scale, the batch size beyond which more examples per step stop cutting steps.

A batch larger than the devices hold runs as several micro-batches per optimizer step (`accumulate`: their
gradients are summed, then all-reduced once), so the study can go past the memory cap: give the most a replica
holds (`max_per_replica_batch`, from `tftoolkit find-batch`) and each batch takes the fewest micro-batches that fit.
Batch norm then normalises over one micro-batch of all replicas, not the whole global batch.

""" + run_hint("02_batch_and_lr_scaling", " -p global_batches '[32, 128]' -p warmup_epochs '[0.0]' "
               "-p max_per_replica_batch 32")),
    params("""
global_batches: list = [32, 128, 256]  # global batches to compare (each divides by replicas)
lr_rules: list = ["none", "linear", "sqrt"]  # how the LR scales with the global batch
warmup_epochs: list = [0.0, 0.5]  # warmup lengths to compare, in epochs
replicas: int = 2  # replicas for every run: the first N GPUs, or N simulated CPU devices
accumulate: int = 1  # micro-batches per replica per optimizer step, at least: their gradients summed, one all-reduce
max_per_replica_batch: int = 0  # the most a replica holds (tftoolkit find-batch): larger batches accumulate; 0: no cap
base_lr: float = 0.0125  # learning rate at base_batch (tuned there: 0.99 validation accuracy in 2 epochs)
base_batch: int = 32  # global batch at which base_lr is right: the smallest batch compared
optimizer: str = "momentum"  # sgd, momentum (Goyal et al.'s), adam, adamw or lamb
schedule: str = "constant"  # after warmup: constant, cosine or step decay
epochs: float = 2.0  # epochs per run: the same for every batch
train_images: int = 0  # use only the first N training images (0: all of them)
model: str = "small_cnn_bn"  # registered model name, or package.module:function returning a Keras model
dataset: str = "shapes16k"  # shapes16k (made on first use), synthetic, or a folder of images / TFRecords
noise_scale: bool = True  # also measure the gradient noise scale B_simple in every run (a few % of a step)
seed: int = 0  # seed for weights and data order (the same for every run)
data_service: str = ""  # HOST:PORT of a tf.data service (tftoolkit data-service start) to read the input from; "": local
smoke: bool = False  # shrink to a < 1 minute check on 2 CPU cores (synthetic data, a few steps)
out_dir: str = "runs/02_batch_and_lr_scaling"  # where runs/, results.csv and figures/ go
"""),
    code("""
%matplotlib inline
import tftoolkit
from tftoolkit.experiments import grid, notebook as nb
from tftoolkit.experiments.report import figures, results, tables

global_batches = nb.smoke_values(nb.as_list(global_batches, int, "global_batches"), smoke, "global_batches")
lr_rules = nb.smoke_values(nb.as_list(lr_rules, str, "lr_rules"), smoke, "lr_rules")  # -p passes lists as text
warmup_epochs = nb.smoke_values(nb.as_list(warmup_epochs, float, "warmup_epochs"), smoke, "warmup_epochs")
tftoolkit.init_devices(replicas)  # first: TensorFlow fixes its device list when it initialises
out = nb.start(out_dir)
"""),
    code("""
config = nb.training_config(smoke, replicas=replicas, base_lr=base_lr, base_batch=base_batch, optimizer=optimizer,
                            schedule=schedule, epochs=epochs, train_images=train_images, model=model, dataset=dataset,
                            noise_scale=noise_scale, seed=seed, measure=False, data_service=data_service)
nb.prepare_data(config["dataset"])
config
"""),
    md("## Train every combination (a diverged or failed run is recorded and the grid goes on)"),
    code("""
batches = nb.batch_points(global_batches, replicas, accumulate, max_per_replica_batch)
table = grid.train_grid(config, {"lr_rule": lr_rules, "warmup_epochs": warmup_epochs}, out, paired=batches)
table.filter(items=["run", "global_batch", "accumulate", "per_replica_batch", "lr_rule", "warmup_epochs",
                    "learning_rate", "status", "error", "final_loss", "val_accuracy"])
"""),
    md("## Training loss"),
    code("""
res = results.load([out])
figures.figure(res, "loss_curves", out / "figures")
"""),
    md("## Validation accuracy after each epoch"),
    code("""
figures.figure(res, "val_accuracy", out / "figures")
"""),
    md("## Final accuracy against global batch, per rule"),
    code("""
figures.figure(res, "final_accuracy", out / "figures")
"""),
    code("""
tables.save_tables(res, out)
"""),
]

NOTEBOOKS["03_communication"] = [
    md("""
# 03 · Communication: all-reduce cost, and when it outgrows compute

All-reduce time and bus bandwidth against message size for every cross-device implementation available here,
the model's own gradient all-reduce (its real tensor sizes, drawn as a star), and the per-step compute and
all-reduce time of real training as replicas grow: where the all-reduce share passes 50%, adding replicas stops
paying off.

""" + run_hint("03_communication", " -p replicas '[1, 2]'")),
    params("""
replicas: list = [1, 2, 4]  # replica counts for the compute-vs-communication runs (the bench uses the largest)
sizes: str = "4KiB..64MiB"  # all-reduce message sizes: A..B sweeps powers of two, or a list like 4KB,1MB
impls: str = "all"  # all-reduce implementations to time: all, or a list like nccl,reduce_to_one
repeats: int = 10  # timed repeats per size (the median is reported)
model: str = "small_cnn"  # the model whose gradients are all-reduced and trained
per_replica_batch: int = 64  # examples per replica per step in the training runs
steps: int = 150  # optimizer steps per training run (from ~100 steps the breakdown fits measure_budget)
measure_budget: float = 0.1  # the most of each run's wall time measuring may take; a run too short for the breakdown says "not measured"
dataset: str = "synthetic"  # synthetic keeps input out of the picture; shapes16k or a folder also work
smoke: bool = False  # shrink to a < 1 minute check on 2 CPU cores
out_dir: str = "runs/03_communication"  # where allreduce.csv, runs/ and figures/ go
"""),
    code("""
%matplotlib inline
import tftoolkit
from tftoolkit.experiments import notebook as nb, scale
from tftoolkit.experiments.report import figures, results, tables
from tftoolkit.measure import allreduce
from tftoolkit.measure.allreduce import bench as allreduce_bench

replicas = nb.as_list(replicas, int, "replicas")  # papermill's -p passes '[1, 2]' as text
tftoolkit.init_devices(max(replicas))  # first: TensorFlow fixes its device list when it initialises
out = nb.start(out_dir)
"""),
    md("## All-reduce time and bus bandwidth against size"),
    code("""
table = allreduce_bench.bench(max(replicas), "4KiB,64KiB" if smoke else sizes, impls, repeats=2 if smoke else repeats,
                             models=(model,), max_chain=2 if smoke else allreduce.MAX_CHAIN, out=out)
res = results.load([out])
figures.figure(res, "allreduce_time", out / "figures")
"""),
    code("""
figures.figure(res, "busbw", out / "figures")
"""),
    md("## The model's own gradient all-reduce (all its gradient tensors, as the training step packs them)"),
    code("""
table[table["payload"].astype(str).str.startswith("grads:")]
"""),
    md("""
## Compute vs communication as replicas grow

Each run is timed three ways after training: the full step, the step without the gradient all-reduce
(compute), and the gradient all-reduce alone.
"""),
    code("""
config = nb.training_config(smoke, model=model, per_replica_batch=per_replica_batch, steps=steps, dataset=dataset,
                            measure_budget=measure_budget)
config["measure"] = True  # the breakdown is what this notebook is about, smoke or not
nb.prepare_data(config["dataset"])
steps_table = scale.scale(config, nb.smoke_values(replicas, smoke, "replicas"), out / "compute")
steps_table[["replicas", "step_time_s", "compute_time_s", "allreduce_time_s", "communication_fraction"]]
"""),
    code("""
res = results.load([out])
figures.figure(res, "comm_vs_compute", out / "figures")
"""),
    code("""
tables.save_tables(res, out)
"""),
]

NOTEBOOKS["04_report"] = [
    md("""
# 04 · Report

What the runs found, then the figures that show it: data-parallel scaling, communication, batch-size /
learning-rate curves, and whatever a sweep's own notebook recorded in `results.json` (a table, and each numeric
result against each swept parameter), each figure with a caption; a section the results hold no data for is left
out. Every point's status is listed (failed, timed-out and diverged points with their errors). It reads files only (no TensorFlow), so it also renders on a laptop from results
copied off a GPU server. With no `sweep_dirs` it reports on every run or sweep folder next to `out_dir` (so,
run after notebooks 01-03, on theirs). `tftoolkit sweep` runs it on each sweep into `SWEEP_DIR/report.html`,
and `make demo` on the demo's sweeps; those pages show the results, not this code.

Headless: `papermill notebooks/04_report.ipynb report.ipynb -p smoke True`, or
`-p sweep_dirs '[\"runs/demo/scaling\"]' -p out_dir runs/report` for chosen folders.
""", notebook_only=True),
    params("""
sweep_dirs: list = []  # folders to report on (sweeps, run folders, all-reduce benches); empty: all next to out_dir
out_dir: str = "runs/04_report"  # where figures/ and the tables go; its parent is searched when sweep_dirs is empty
smoke: bool = False  # no effect: the report only reads files (kept so every notebook takes it)
"""),
    code("""
%matplotlib inline
from IPython.display import Markdown
from tftoolkit.experiments import findings, notebook as nb
from tftoolkit.experiments.report import header, results, sections, tables

out = nb.start(out_dir)
res = results.load(results.discover(nb.as_list(sweep_dirs, str, "sweep_dirs") if sweep_dirs else [], out))
"""),
    code("""
Markdown(header.markdown(res))
"""),
    code("""
Markdown(findings.markdown(res))
"""),
    md("## Every point: its status and key figures"),
    code("""
tables.status_counts(res)
"""),
    code("""
tables.overview(res).fillna("")  # blank where a column is not that sweep's parameter or figure
"""),
    code("""
sections.section(res, "scaling", out / "figures")
"""),
    code("""
sections.section(res, "communication", out / "figures")
"""),
    code("""
sections.section(res, "batch", out / "figures")
"""),
    code("""
sections.section(res, "recorded", out / "figures")
"""),
    md("## Tables (written to `out_dir`: runs.csv, points.csv, scaling.csv)"),
    code("""
tables.save_tables(res, out)
"""),
]


NOTEBOOKS["05_batch_science"] = [
    md("""
# 05 · Batch-size science: how many GPUs are worth using?

Two halves of one question (McCandlish et al. 2018; Shallue et al. 2019). **Statistics**: past the critical batch
size B_crit a bigger global batch stops cutting the number of optimizer steps; the gradient noise scale
B_simple = tr(Σ)/|G|², measured during training from what data parallelism already computes, estimates it.
**Systems**: past some replica count the gradient all-reduce outgrows the compute. This notebook finds an LR and
the largest batch that fits, measures the noise scale, turns it into a recommended global batch and GPU count, and
predicts speedup and efficiency for 1…64 GPUs. The same steps on the command line: `tftoolkit find-lr`,
`find-batch`, `train --noise-scale`, `advise` and `predict`.

What smoke mode shows (the command below, and this notebook's page in the docs): every step runs, on 30 steps of
random images, so the noise scale is honestly **NOT RELIABLE** (a run at chance has no gradient signal to measure)
and the advice says why it recommends nothing; the forecast takes `compute_ms` (50 ms, a stand-in for one GPU's
step, since simulated CPU replicas measure the CPU). A real answer is the notebook with `smoke=False` (shapes16k,
300 steps: minutes on 4 CPU replicas) or a run on GPUs, where the forecast takes the run's own compute.

""" + run_hint("05_batch_science", " -p compute_ms 50")),
    params("""
replicas: int = 4  # data-parallel replicas: the first N GPUs, or N simulated CPU devices
per_replica_batch: int = 32  # examples per replica per step (the global batch is this x replicas)
model: str = "small_cnn"  # registered model name, or package.module:function returning a Keras model
dataset: str = "shapes16k"  # shapes16k (made on first use), synthetic, or a folder of images / TFRecords
optimizer: str = "momentum"  # the optimiser of the LR sweep and of the training run
steps: int = 300  # training steps over which the noise scale is measured
lr_steps: int = 200  # steps of the exponential LR sweep
lr_min: float = 1e-05  # first LR of the sweep
lr_max: float = 10.0  # last LR of the sweep (it stops earlier when the loss blows up)
memory_limit_mb: float = 512.0  # batch finder: one replica's memory cap in MiB (needed on CPU replicas; 0: none on GPUs)
interconnect: str = "nvlink4"  # link inside a host for the predictions: pcie4, pcie5, nvlink3 or nvlink4
inter_host: str = "ib200"  # link between hosts: ib100, ib200 or ib400
max_replicas: int = 64  # largest GPU count to advise on and predict for
compute_ms: float = 0.0  # one GPU's compute per step in ms for the forecast (0: the run's own; on simulated CPU replicas the forecast is then refused, and says why)
seed: int = 0  # seed for weights and data order
smoke: bool = False  # shrink to a < 2 minute check on 2 CPU cores (synthetic data, a few steps)
out_dir: str = "runs/05_batch_science"  # where the finders' folders, train/, the tables and figures/ go
"""),
    code("""
%matplotlib inline
import tftoolkit
from tftoolkit.experiments import notebook as nb
from tftoolkit.planner import predict
from tftoolkit.tuning import advise, finders
from tftoolkit.plots import batch as batch_plots
from tftoolkit.plots import predict as predict_plots
from tftoolkit.plots.theme import save_figure

tftoolkit.init_devices(replicas)  # first: TensorFlow fixes its device list when it initialises
out = nb.start(out_dir)
"""),
    code("""
config = tftoolkit.RunConfig(**nb.training_config(smoke, replicas=replicas, per_replica_batch=per_replica_batch,
                                                  model=model, dataset=dataset, optimizer=optimizer, steps=steps,
                                                  seed=seed)).replace(measure=True)  # predict needs compute_time_s
nb.prepare_data(config.dataset)
config
"""),
    md("""
## 1. Learning rate: an exponential sweep under the strategy
The LR grows from `lr_min` to `lr_max` and the sweep stops when the smoothed loss blows up. The suggestion is the
LR where the loss falls fastest per unit of log LR, for this global batch (and, under the config's LR rule, the
`base_lr` that scales to it).
"""),
    code("""
lr = finders.find_lr(config, out / "find_lr", lr_min=lr_min, lr_max=lr_max, steps=20 if smoke else lr_steps,
                     figures=False)
{k: lr[k] for k in ("suggested_lr", "suggested_base_lr", "suggestion", "stop_reason")}
"""),
    code("""
fig = batch_plots.lr_finder(lr["frame"], lr["suggested_lr"])
save_figure(fig, out / "figures", "lr_find")
fig
"""),
    md("""
## 2. The largest per-replica batch that fits
Doubling, then bisecting on out-of-memory, with one real training step per trial on every replica. On CPU replicas
there is no device memory to run out of: a batch fits while its estimated training memory stays under
`memory_limit_mb`.
"""),
    code("""
fit = finders.find_batch(config, out / "find_batch", memory_limit_mb=(8.0 if smoke else memory_limit_mb) or None,
                         figures=False)
{k: fit[k] for k in ("max_per_replica_batch", "max_global_batch", "criterion", "trials")}
"""),
    code("""
fig = batch_plots.batch_finder(fit["frame"], (fit["memory_limit_mb"] or 0) * 2**20)
save_figure(fig, out / "figures", "batch_find")
fig
"""),
    md("""
## 3. Train with the gradient noise scale measured
With `noise_scale=True` each step also takes the squared norms of every replica's gradient (B_small = per-replica
batch) and of the all-reduced one (B_big = global batch): each step's unbiased |G|² and tr(Σ) go to steps.csv
(McCandlish et al., app. A.1). The run's noise scale is the ratio of the two averaged over the later half of the
run, with a 90% interval, and the summary says when it cannot be trusted (a run at chance, too few steps, a wide
interval). It trains at the LR the sweep suggested.
"""),
    code("""
# Smoke's few steps leave the |G|^2 estimate at the mercy of the data order; 30 still take seconds.
noise_steps = 30 if smoke else config.steps
summary = tftoolkit.train(config.replace(noise_scale=True, base_lr=lr["base_lr_to_use"], steps=noise_steps),
                          out / "train", force=True)
{k: summary.get(k) for k in ("status", "noise_scale", "noise_scale_interval", "noise_scale_reliable", "noise_scale_warnings")}
"""),
    code("""
fig = batch_plots.noise_scale_trace(advise.read_run(out / "train")[1])
save_figure(fig, out / "figures", "noise_scale")
fig
"""),
    md("""
## 4. Advice: global batch and GPU count from the noise scale
Steps and examples to reach the same loss trade off as (S/S_min − 1)(E/E_min − 1) = 1 with B_crit ≈ B_simple;
at B = B_crit both cost twice their minimum. With an interconnect, the scaling model adds the predicted time to
the same loss. Reasons not to trust the noise scale come first; without a positive one there is no recommendation.
"""),
    code("""
advice = advise.advise(out / "train", out, max_replicas=max_replicas, interconnect=interconnect,
                       inter_host=inter_host, figures=False)
print(advise.advice_text(advice))
"""),
    code("""
fig = batch_plots.tradeoff(advice["frame"])
save_figure(fig, out / "figures", "tradeoff")
fig
"""),
    md("""
## 5. Scaling model: speedup and efficiency for 1…64 GPUs
Step time = compute (from this run) + ring all-reduce of the gradients, 2(N−1)/N·S/B + 2(N−1)·α, for each link
preset (figures and their sources in `tftoolkit.predict`), hierarchical across hosts of 8 GPUs. Compute measured
on simulated CPU replicas says nothing about a GPU's step: there the forecast needs `compute_ms`, and without it
says so instead. Where the forecast covers this run's replica count, the measured point is printed beside it.
"""),
    code("""
scenario = predict.Scenario(inter_host=inter_host, max_replicas=max_replicas, compute_ms=compute_ms or None)
prediction = predict.run(out / "train", out, scenario, figures=False, on_refusal="report")
print(predict.forecast_text(prediction))
"""),
    code("""
fig = predict_plots.efficiency(prediction["frame"])
save_figure(fig, out / "figures", "efficiency_vs_replicas")
fig
"""),
    md("Written to `out_dir`: `find_lr/`, `find_batch/`, `train/`, `advice.json`, `tradeoff.csv`, "
       "`prediction.csv`, `prediction.json` and `figures/`."),
]


NOTEBOOKS["06_your_fit"] = [
    md("""
# 06 · Your own `model.fit`, measured

Most TensorFlow training is a Keras model compiled under `MirroredStrategy` and trained with `model.fit`. Add one
callback, `tftoolkit.RunRecorder(out_dir)`, and that fit writes a run directory like the toolkit's own runs:
images/sec with its uncertainty (warm-up steps left out, the devices synchronised before each clock read),
step-time percentiles, the final metrics, the hardware monitor, the environment and TensorBoard events. The
report, the plots, `tftoolkit tensorboard`, `advise` and `predict` read it. Here the data and the model are small
stand-ins from the package (`tftoolkit.experiments.your_fit`): replace them, and the `fit` call, with yours.

A scaling study of your fit is this notebook at 1, 2 and 4 replicas, each in its own process:
`tftoolkit sweep sweeps/your_fit.yaml --out runs/your_fit`; its report draws images/sec and the efficiency
against replicas.

""" + run_hint("06_your_fit", " -p replicas 2")),
    params("""
replicas: int = 2  # data-parallel replicas: the first N GPUs, or N simulated CPU devices
gpus: list = []  # GPU numbers to use instead, e.g. [0, 2] ([]: the first `replicas`)
per_replica_batch: int = 64  # examples per replica per step: fit's batch_size is this x replicas
epochs: int = 3  # epochs of model.fit
train_images: int = 4096  # training examples (rendered in memory)
val_images: int = 1024  # validation examples, evaluated after every epoch
image_size: int = 32  # image side in pixels
learning_rate: float = 0.001  # Adam's learning rate
warmup_steps: int = 10  # steps left out of images/sec (tracing, autotuning)
seed: int = 0  # seed for the data
smoke: bool = False  # shrink to a < 30 s check on 2 CPU cores (fewer, smaller images; 2 epochs)
out_dir: str = "runs/06_your_fit"  # where run/ (the recorded fit), the tables and figures/ go
"""),
    code("""
%matplotlib inline
import tftoolkit
from tftoolkit import summary
from tftoolkit.experiments import notebook as nb, your_fit
from tftoolkit.experiments.report import figures, results, tables

setup = tftoolkit.init_devices(replicas, nb.as_list(gpus, int, "gpus") if gpus else None)  # first: before TensorFlow
import keras  # after the devices: Keras imports TensorFlow
out = nb.start(out_dir)
p = your_fit.settings(smoke, train_images=train_images, val_images=val_images, image_size=image_size, epochs=epochs,
                      warmup_steps=warmup_steps)
"""),
    md("## Your data, your strategy, your model (here: the package's stand-ins)"),
    code("""
(x, y), (x_val, y_val) = your_fit.example_data(p["train_images"], p["val_images"], p["image_size"], seed)
strategy = your_fit.mirrored(setup)  # in a script on GPUs: tf.distribute.MirroredStrategy()
"""),
    code("""
with strategy.scope():
    model = your_fit.example_model(p["image_size"])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
"""),
    md("""
## Your usual `model.fit`, with one callback more

`force=True` lets a rerun of this notebook replace the fit it recorded before with other parameters.
"""),
    code("""
recorder = tftoolkit.RunRecorder(out / "run", warmup_steps=p["warmup_steps"], force=True)
history = model.fit(x, y, batch_size=per_replica_batch * strategy.num_replicas_in_sync, epochs=p["epochs"],
                    validation_data=(x_val, y_val), verbose=2, callbacks=[recorder])
"""),
    md("## Images per second, and what else the run directory holds"),
    code("""
result = summary.read(out / "run")
{k: result.get(k) for k in ("status", "replicas", "global_batch", "images_per_sec", "images_per_sec_uncertainty",
                            "timed_steps", "step_time_p50_s", "step_time_p90_s", "val_loss", "val_accuracy")}
"""),
    md("## The hardware monitor over the fit (GPUs, or the host's CPUs for simulated replicas)"),
    code("""
res = results.load([out])
figures.figure(res, "monitor", out / "figures")
"""),
    code("""
tables.save_tables(res, out)
"""),
    md("Written to `out_dir`: `run/` (config.json, summary.json, steps.csv, evals.csv, monitor.csv, env.json, "
       "tensorboard/), `runs.csv`, `points.csv` and `figures/`. `tftoolkit tensorboard OUT_DIR/run` shows the "
       "events."),
]

NOTEBOOKS["07_choosing_hardware"] = [
    md("""
# 07 · Choosing hardware

Which server should you get? For a model (a registered name, a keras.applications name or your own
`package.module:function`: its parameters and FLOPs are counted) and a list of candidate servers (catalogue systems,
or your own: a GPU and a link, with a 1-GPU rate where you have one), the planner (`tftoolkit predict` without a run directory; docs/guides/planner.md) forecasts
throughput, scaling efficiency and time per epoch against GPU count, each with its interval from the published
validation rows (the band), and the energy per epoch from the GPUs' TDP; with prices, the cost per epoch. A
candidate whose GPU cannot hold the per-GPU batch (weights, gradients, optimizer slots and activations:
tftoolkit/planner/memory.py) is marked `fits = False`, with the largest per-GPU batch that would fit.

""" + run_hint("07_choosing_hardware")),
    params("""
model: str = "resnet50"  # a registered model, a keras.applications name or package.module:function: its parameters and FLOPs are counted
per_replica_batch: int = 64  # images per GPU per step
precision: str = "float32"  # Keras policy: float32 (TF32 on Ampere+), mixed_float16, mixed_bfloat16
candidates: list = [{"name": "DGX-1 V100", "gpu": "v100", "interconnect": "dgx1-v100", "images_per_sec": 360, "price_per_gpu_hour": 2.5}, {"name": "8x RTX 2080 Ti PCIe", "gpu": "rtx-2080-ti", "interconnect": "pcie3", "images_per_sec": 290, "price_per_gpu_hour": 0.6}, "dgx-a100"]  # servers: catalogue systems (no rate: compute from the model's FLOPs) or dicts with gpu, interconnect, a 1-GPU images_per_sec (here example figures, not measured: give yours) and an optional price per GPU-hour
replica_counts: list = [1, 2, 4, 8]  # GPU counts to forecast
examples_per_epoch: int = 1_281_167  # ImageNet-1k's training images
smoke: bool = False  # the forecast is arithmetic (the model is built once to count it): smoke changes nothing but is accepted like every notebook's
out_dir: str = "runs/07_choosing_hardware"  # where choice.csv and figures/ go
"""),
    code("""
%matplotlib inline
from tftoolkit import fileio
from tftoolkit.experiments import notebook as nb
from tftoolkit.plots import predict as predict_plots
from tftoolkit.plots.theme import save_figure
from tftoolkit.planner import candidates as cand

out = nb.start(out_dir)
"""),
    code("""
choice = cand.compare(candidates, model=model, per_replica_batch=per_replica_batch,
                      replica_counts=nb.as_list(replica_counts, int, "replica_counts"),
                      examples_per_epoch=examples_per_epoch, precision=precision)
fileio.write_csv(out / "choice.csv", choice)
choice[["candidate", "compute_from", "fits", "largest_per_replica_batch", "replicas", "images_per_sec",
        "images_per_sec_low", "images_per_sec_high", "efficiency", "epoch_s", "energy_kwh_per_epoch",
        "cost_per_epoch"]].round(3)
"""),
    code("""
fig = predict_plots.hardware_choice(choice)
save_figure(fig, out / "figures", "hardware_choice")
fig
"""),
]


def build(name: str, cells: list) -> nbformat.NotebookNode:
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: regenerating an unchanged notebook changes no byte
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = dict(KERNEL)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(argv: list[str]) -> int:
    """Write every notebook; with --check, only report which committed notebooks differ from this file."""
    check = "--check" in argv
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = HERE / f"{name}.ipynb"
        nb = build(name, cells)
        nbformat.validate(nb)
        text = nbformat.writes(nb) + "\n"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if check and stale:
        print(f"out of date (run python notebooks/make_notebooks.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
