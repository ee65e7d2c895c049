"""How fast this machine is right now: a fixed, single-threaded CPU loop (3 million chained MD5s), in seconds.

    python benchmarks/machine_speed.py

Shared and virtual machines change speed for minutes at a time (on the 2-core CI-like VM: 1.3-1.4 s in a fast
phase, 2.0-2.2 s in a slow one). Suite and benchmark times follow it, so BENCHMARKS.md gives this figure next to
them; compare runs made at the same speed.
"""

import hashlib
import time

t0 = time.perf_counter()
h = b"x"
for _ in range(3_000_000):
    h = hashlib.md5(h).digest()
print(f"machine_speed {time.perf_counter() - t0:.2f} s")
