"""What keeping TensorFlow's import out of Python's garbage collector saves (engine/devices.frozen_import).

Each variant is a fresh process, timed as a whole (user + sys CPU of the child, from ``os.wait4``), the two variants
alternating over rounds (each variant first in every other round) so that drift in the machine's load hits
both alike:

- ``import``: ``devices.import_tensorflow()`` and a normal interpreter exit (what a notebook kernel, a test's fresh
  interpreter or a user's script pays), with ``frozen_import`` as shipped and with it replaced by a no-op;
- ``train``: ``tftoolkit train`` through the console script's ``run`` (which skips the interpreter's teardown):
  small_cnn, momentum at a constant LR, 16 px synthetic images, 512 of them, 2 replicas, 3 epochs.

    .venv/bin/python benchmarks/bench_gc_freeze.py [--rounds 5] [--cases import,train]

Prints every run, then per case the median CPU frozen / not frozen and the ratio pair by pair (target: <= 0.9).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

NOT_FROZEN = "import contextlib\nfrom tftoolkit.engine import devices\ndevices.frozen_import = contextlib.nullcontext\n"
CASES = {
    "import": "from tftoolkit.engine import devices\ndevices.import_tensorflow()\n",
    "train": "import sys\nfrom tftoolkit.cli import run\nsys.argv = ['tftoolkit', 'train', *sys.argv[1:]]\nrun()\n",
}
TRAIN = ["--dataset", "synthetic", "--image-size", "16", "--train-images", "512", "--model", "small_cnn",
         "--replicas", "2", "--epochs", "3", "--optimizer", "momentum", "--schedule", "constant", "--warmup-epochs",
         "0", "--quiet"]


def cpu_of(code: str, args: list[str]) -> float:
    """User + sys CPU seconds of ``python -c code args``, which must exit 0."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="alternating frozen / not frozen pairs per case")
    ap.add_argument("--cases", default="import,train", help=f"comma-separated, of {','.join(CASES)}")
    args = ap.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown or args.rounds < 2:
        ap.error(f"unknown case(s) {unknown}" if unknown else "--rounds must be >= 2 (a ratio of medians needs pairs)")
    cpu: dict = {}
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            for case in cases:
                for frozen in ((True, False) if r % 2 == 0 else (False, True)):  # each first in half the rounds
                    extra = TRAIN + ["--out", os.path.join(work, f"{r}-{frozen}")] if case == "train" else []
                    code = CASES[case] if frozen else NOT_FROZEN + CASES[case]
                    cpu.setdefault((case, frozen), []).append(cpu_of(code, extra))
                    print(f"round {r + 1}: {case:6s} {'frozen    ' if frozen else 'not frozen'} "
                          f"{cpu[(case, frozen)][-1]:6.2f} s CPU", flush=True)
    print()
    for case in cases:
        on, off = cpu[(case, True)], cpu[(case, False)]
        pairs = ", ".join(f"{a / b:.3f}" for a, b in zip(on, off))
        print(f"{case}: CPU frozen / not frozen {statistics.median(on) / statistics.median(off):.3f} "
              f"(medians {statistics.median(on):.2f} / {statistics.median(off):.2f} s; pairs {pairs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
