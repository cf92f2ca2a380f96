"""Anchor state hashes: the one hash behind every ``env_state_hash``.

:func:`text_hash` is the digest (sha1 hex of a text's UTF-8 bytes); every environment computes
its state's canonical text and hashes it with it. :func:`state_hash` is the canonical,
order-insensitive hash of a structured observation, for callers without a canonical text.

GiGPO groups steps that acted from the same environment state (arXiv 2505.10978, Eq. 6), so
equal states must give equal keys. ``str(observation)`` does not: two equal dicts built in a
different key order print differently. :func:`state_hash` encodes an observation canonically
(mapping keys sorted, numbers typed, arrays with dtype and shape) and hashes the encoding.
The anchor grouping itself accepts only ``str`` or ``bytes`` hashes and refuses anything
else, so a structured observation can never be ``str()``-ed by accident.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["state_hash", "text_hash"]


def _encode(x: Any, path: str) -> Any:
    """A JSON-able canonical form of ``x``; each kind tagged so that 1, 1.0, "1" and True differ."""
    if x is None or isinstance(x, (bool, np.bool_)):
        return ["b", None if x is None else bool(x)]
    if isinstance(x, (int, np.integer)):
        return ["i", int(x)]
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if math.isnan(f):
            raise ValueError(f"state_hash: NaN at {path or 'the observation'} (NaN != NaN: equal states would differ)")
        return ["f", 0.0 if f == 0 else f.hex()]  # -0.0 == 0.0; hex keeps every bit of the value
    if isinstance(x, str):
        return ["s", x]
    if isinstance(x, (bytes, bytearray)):
        return ["y", bytes(x).hex()]
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return ["a", list(x.shape), [_encode(v, f"{path}[{i}]") for i, v in enumerate(x.reshape(-1).tolist())]]
        return ["n", x.dtype.str, list(x.shape), np.ascontiguousarray(x).tobytes().hex()]
    if isinstance(x, Mapping):
        items = []
        for k, v in x.items():
            if not isinstance(k, (str, int, np.integer)) or isinstance(k, bool):
                raise TypeError(f"state_hash: mapping key {k!r} at {path or 'the observation'} is not str or int")
            items.append((["s", k] if isinstance(k, str) else ["i", int(k)], _encode(v, f"{path}[{k!r}]")))
        return ["m", sorted(items, key=lambda kv: repr(kv[0]))]
    if isinstance(x, (list, tuple)):
        return ["l", [_encode(v, f"{path}[{i}]") for i, v in enumerate(x)]]
    if isinstance(x, (set, frozenset)):
        return ["u", sorted((_encode(v, f"{path}{{}}") for v in x), key=repr)]
    raise TypeError(
        f"state_hash: unsupported {type(x).__name__} at {path or 'the observation'}; use str, bytes, numbers, "
        "None, lists, tuples, sets, mappings or numpy arrays"
    )


def text_hash(text: str) -> str:
    """sha1 (40 lowercase hex characters) of ``text`` encoded as UTF-8: the digest of every anchor
    state, for a state whose canonical text the caller has already built (the environments'
    ``canonical_state``).

    Raises:
        TypeError: ``text`` is not a str (never ``str()``-ed here).
    """
    if not isinstance(text, str):
        raise TypeError(f"text_hash: expected str, got {type(text).__name__}")
    return hashlib.sha1(text.encode()).hexdigest()


def state_hash(observation: Any) -> str:
    """Canonical SHA-1 hex digest of a structured observation, for ``info["env_state_hash"]``.

    Equal observations give equal hashes whatever the order of their mapping keys (or set
    elements); lists, tuples and arrays keep their order. Kinds are told apart (``1``, ``1.0``,
    ``True`` and ``"1"`` hash differently; a list and a tuple of the same items hash alike),
    ``-0.0`` equals ``0.0``, and numpy arrays hash their dtype, shape and bytes.

    Args:
        observation: str, bytes, bool, int, float, None, list, tuple, set, a mapping with
            str or int keys, a numpy array, nested freely.
    Returns:
        40 lowercase hex characters.
    Raises:
        TypeError: an unsupported type (an arbitrary object, whose ``str()`` is not a state).
        ValueError: a NaN anywhere (it is not equal to itself).
    """
    return text_hash(json.dumps(_encode(observation, ""), separators=(",", ":"), ensure_ascii=True))
