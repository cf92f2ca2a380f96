"""Argument checks shared by the public maths functions: a setting is a finite number in its range.

One helper, so every function words the refusal the same way: the parameter's name, the range
it must lie in, and the value given (``"eps_high: must be a finite number >= 0, got nan"``).
Settings are scalars, so a check costs a few comparisons; array inputs are checked where each
function reads them, vectorised.
"""

from __future__ import annotations

import math
from typing import Any


def check_number(
    name: str,
    value: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    integer: bool = False,
) -> float:
    """``value`` as a float, after checking that it is a finite real number in the given range.

    Args:
        name: the parameter's name, used in the message.
        value: a Python, numpy or 0-dim torch real number (a bool is refused).
        ge, gt, le, lt: bounds (``>=``, ``>``, ``<=``, ``<``), None for none.
        integer: the value must also be a whole number (``3`` or ``3.0``).
    Returns:
        ``float(value)``.
    Raises:
        ValueError: not a real number, NaN, infinite, fractional where ``integer``, or out of
            range; the message names ``name``, the range and the value.
    """
    rng = " and ".join(
        f"{op} {bound:g}" for op, bound in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if bound is not None
    )
    want = f"a finite {'whole ' if integer else ''}number" + (f" {rng}" if rng else "")
    try:
        if isinstance(value, bool):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be {want}, got {value!r}") from None
    ok = math.isfinite(x) and (not integer or x.is_integer())
    ok = ok and (ge is None or x >= ge) and (gt is None or x > gt) and (le is None or x <= le) and (lt is None or x < lt)
    if not ok:
        raise ValueError(f"{name}: must be {want}, got {value!r}")
    return x
