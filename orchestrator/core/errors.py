"""One way to say what is wrong with a value: field path, message and the (truncated) value given."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

MAX_VALUE_CHARS = 80
"""Longest ``repr`` of an offending value quoted in a message (longer ones are cut with '...')."""


def short_repr(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a 1 MB id is never echoed back whole."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def field_path(loc: Sequence[Any]) -> str:
    """``("filter", "band", 0)`` -> ``"filter.band.0"``."""
    return ".".join(str(x) for x in loc)


def describe_errors(errors: Iterable[dict], *, root: str = "", with_input: bool = True) -> str:
    """Pydantic's ``err.errors()`` as ``"path: message (got value); ..."``.

    Args:
        errors: pydantic error dicts (``loc``, ``msg``, optional ``input``).
        root: the path shown for an error at the top level (empty ``loc``; none when empty).
        with_input: quote the offending value (truncated by :func:`short_repr`); never for a
            missing field (pydantic's input is then the enclosing object) or a validator's own
            ``ValueError`` (our validators name their values).
    """
    parts = []
    for e in errors:
        path = field_path(e.get("loc", ())) or root
        msg = e.get("msg", "").removeprefix("Value error, ")  # our validators' messages name their fields
        part = f"{path}: {msg}" if path else msg
        quoted = "input" in e and e.get("loc") and e.get("type") not in _NO_INPUT  # not the whole document of a top-level error
        if with_input and quoted:
            part += f" (got {short_repr(e['input'])})"
        parts.append(part)
    return "; ".join(parts)


_NO_INPUT = frozenset({"missing", "value_error"})
"""Error types whose pydantic ``input`` is not the offending value (see :func:`describe_errors`)."""


class ReplenishCapError(RuntimeError):
    """The replenish-round cap was hit under ``on_cap='raise'``. The open batch is kept."""


class DataExhaustedError(RuntimeError):
    """No task is left to roll out (``max_epochs`` or ``max_rollouts`` reached) and no batch remains."""
