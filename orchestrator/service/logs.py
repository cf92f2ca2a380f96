"""Logging for the service's own processes (the actor, the REST replicas).

Ray starts actors with Python's default WARNING level, so the INFO lines that record policy
changes and resumes would vanish. :func:`enable_service_logging` gives the ``trinity_dso``
logger a stderr handler at INFO (once per process); Ray writes actor stderr to its worker
logs and, with ``log_to_driver=True`` (as ``trinity-dso serve`` starts Ray), to the
driver's terminal.
"""

from __future__ import annotations

import logging
import sys


def enable_service_logging(level: int = logging.INFO) -> logging.Logger:
    """Attach one stderr handler to the ``trinity_dso`` logger (idempotent); returns it."""
    logger = logging.getLogger("trinity_dso")
    if not any(getattr(h, "_dso", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler._dso = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    return logger
