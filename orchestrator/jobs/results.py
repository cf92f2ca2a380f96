"""Run results written as strict JSON (RFC 8259): what a job's ``*.json`` files hold.

Python's :func:`json.dumps` writes ``NaN`` and ``Infinity`` for non-finite floats, which strict
readers (``jq``, JavaScript's ``JSON.parse``, most dashboards) refuse. A result file here writes
them as ``null``, which means "no value" (a keep rate of a step that classified no group, a mean
over nothing). Numpy and torch scalars and arrays are written as plain numbers and lists, paths as strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def plain(obj: Any) -> Any:
    """``obj`` with numpy and torch values made plain Python, paths made strings, and every non-finite float made None."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (np.ndarray, np.generic)) or type(obj).__name__ == "Tensor":  # arrays, numpy and torch scalars
        return plain(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: Path, obj: Any, indent: int = 1, default: Callable[[Any], Any] | None = None) -> None:
    """Write ``obj`` to ``path`` as strict JSON (:func:`plain`); other objects go through
    ``default`` (as in :func:`json.dumps`), else raise ``TypeError``."""
    Path(path).write_text(json.dumps(plain(obj), indent=indent, allow_nan=False, default=default))
