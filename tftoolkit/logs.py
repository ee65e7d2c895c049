"""The toolkit's logger: one ``tftoolkit`` logger, configured once for the CLI, notebooks and scripts."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("tftoolkit")


def ensure_logging(quiet: bool = False) -> None:
    """Log to stderr when nobody configured the tftoolkit logger (CLI, notebooks, plain scripts)."""
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("tftoolkit: %(message)s"))
        log.addHandler(h)
        log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.INFO)
