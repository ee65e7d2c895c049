"""The hardware catalogue: GPUs, links and named systems, read from the TOML files next to this module.

The files are data, not code (``gpus.toml``, ``links.toml``, ``systems.toml``): every figure names its source
(a key of the file's ``[sources]`` table) or says "unconfirmed". This module only reads them, with the standard
library's ``tomllib``; it never imports TensorFlow, so a forecast for hardware the user does not have runs on a laptop.

    gpu("NVIDIA H100 80GB HBM3")   # the name NVML / nvidia-smi print, or an alias such as "h100-sxm"
    link("pcie3"), system("dgx1-v100")
    gpus(), links(), systems()     # every entry, in file order
    rates()                        # single-GPU training rates (rates.toml), each with its source

An unknown name raises ``ConfigError`` with one line that lists the known names.
"""

from .reader import (FIGURES, GPU, Link, Rate, System, gpu, gpus, link, links, matmul_tflops, normalise, rates,
                     system, systems)

__all__ = ["FIGURES", "GPU", "Link", "Rate", "System", "gpu", "gpus", "link", "links", "matmul_tflops", "normalise",
           "rates", "system", "systems"]
