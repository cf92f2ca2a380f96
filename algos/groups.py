"""Group-relative normalisation, shared by DAPO and GiGPO: one function, one ``Norm``.

GRPO's baseline (DeepSeekMath, arXiv 2402.03300, Sec. 4.1.2), kept by DAPO (arXiv 2503.14476,
Eq. 9) and used by GiGPO for both its episode and step advantages (arXiv 2505.10978, Eq. 3
and 7): ``(x_i - mean_g) / F_norm_g`` within each group g.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

Norm = Literal["std", "none"]
"""``"std"``: divide by the group std plus eps; ``"none"``: divide by 1 (Dr. GRPO)."""
StdConvention = Literal["sample", "population"]
"""Which std ``norm="std"`` divides by. ``"sample"`` (ddof 1, the default): ``torch.std`` as in
verl's ``compute_grpo_outcome_advantage``, verl-agent's GiGPO and Trinity's ``grpo``.
``"population"`` (ddof 0): ``np.std``'s default, e.g. verl's DAPO filter ``np.std(metric)``."""


def check_norm(norm: Any, eps: Any, std: Any = "sample") -> None:
    """Raise ``ValueError`` naming the value when ``norm`` is not a :data:`Norm`, ``eps`` is not
    a finite number >= 0, or ``std`` is not a :data:`StdConvention`."""
    if std not in ("sample", "population"):
        raise ValueError(f"std must be 'sample' or 'population', got {std!r}")
    if norm not in ("std", "none"):
        raise ValueError(f"norm must be 'std' or 'none', got {norm!r}")
    if not (isinstance(eps, (int, float, np.floating)) and not isinstance(eps, bool) and 0 <= float(eps) < np.inf):
        raise ValueError(f"eps: must be a finite number >= 0, got {eps!r}")


def dense_ids(x: np.ndarray) -> np.ndarray:
    """(S,) int64 ``np.unique(x, return_inverse=True)[1]``: the rank of each row's key among the
    distinct keys. Keys that are already dense integer codes (every value of 0..K-1 present)
    are their own ranks and are returned without sorting (the usual case for codes made by
    :func:`algos.gigpo.encode_keys`); anything else is ranked by ``np.unique``."""
    if x.ndim == 1 and x.dtype.kind in "iu" and x.size:
        lo, hi = int(x.min()), int(x.max())
        if lo == 0 and hi < x.size and np.bincount(x, minlength=hi + 1).all():
            return x.astype(np.int64, copy=False)
    return np.unique(x, return_inverse=True)[1].reshape(-1).astype(np.int64)


def first_rows(codes: np.ndarray, k: int) -> np.ndarray:
    """(k,) int64: the first row at which each code in [0, k) appears in ``codes`` ((N,) int),
    ``N`` for a code that does not appear.

    One ``np.minimum.at`` (as fast as the assignment ``first[codes[::-1]] = rows[::-1]``, whose
    result NumPy leaves unspecified when an index repeats: "if an element is set more than once,
    it is not possible to predict the final result").
    """
    first = np.full(k, codes.size, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(codes.size))
    return first


def group_value_order(group_ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(N,) int64 permutation sorting the rows by (group, value): ``np.lexsort((values, group_ids))``
    except for the order among rows of one group with equal values (``0.0`` and ``-0.0`` count
    as equal), which a sum over the sorted rows cannot tell apart once signed zeros are made
    ``+0.0`` (``x + 0.0``, as the callers do where the first value of a group is used).

    An unstable value sort, then a stable sort by group: a radix sort when the codes fit in 16
    bits, cheaper than ``lexsort`` (see bench/README.md, "Reading and writing experiences").

    Args:
        group_ids: (N,) non-negative int codes.
        values: (N,) float, no NaN.
    """
    by_value = np.argsort(values)
    g = group_ids[by_value]
    if g.size and int(g.max()) < 2**16:
        g = g.astype(np.uint16)
    return by_value[np.argsort(g, kind="stable")]


def normalise_in_groups(
    values: np.ndarray, group_ids: np.ndarray, *, norm: Norm = "std", eps: float = 1e-6, std: StdConvention = "sample"
) -> np.ndarray:
    """Group-relative normalisation ``(x - mean_g) / F_norm_g``.

    ``F_norm`` is the group std plus ``eps`` for ``norm="std"`` - the unbiased (ddof=1) std by
    default (as ``torch.std`` in verl's ``compute_grpo_outcome_advantage`` and in verl-agent's
    GiGPO), the population (ddof=0) std with ``std="population"`` - or 1 for ``norm="none"``. Values are shifted by their group minimum and the mean is removed
    before squaring, all in float64 and in a canonical (group, value) order, so equal values
    give exactly 0 and the result does not depend on row order (``-0.0`` is taken as ``+0.0``). Members of singleton groups
    get 0. A group whose ``std + eps`` is 0 (equal values with ``eps=0``) is divided by 1.

    Args:
        values: (N,) float, finite (callers check and raise their own error type).
        group_ids: (N,) int, any integer labels (compacted internally).
        norm: ``"std"`` or ``"none"``.
        eps: >= 0, added to the std.
        std: ``"sample"`` or ``"population"`` (see :data:`StdConvention`).
    Returns:
        (N,) float64 in the input order.
    Raises:
        ValueError: unknown ``norm``, ``eps < 0``, or lengths differ.
    """
    check_norm(norm, eps, std)
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    g = np.asarray(group_ids).reshape(-1)
    if v.shape != g.shape:
        raise ValueError(f"values has {v.size} entries but group_ids {g.size}")
    if v.size == 0:
        return v.copy()
    g = dense_ids(g)
    v = v + 0.0  # -0.0 as +0.0: a group's first sorted value is the same whatever the order of its zeros
    order = group_value_order(g, v)
    vs, gs = v[order], g[order]
    num = int(gs[-1]) + 1
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    count = np.bincount(gs, minlength=num).astype(np.float64)
    d = vs - vs[starts][gs]  # shift by the group minimum: equal values -> exactly 0
    mean = np.bincount(gs, weights=d, minlength=num) / count
    centred = d - mean[gs]
    if norm == "std":
        sq = np.bincount(gs, weights=centred * centred, minlength=num)
        ddof = 1.0 if std == "sample" else 0.0
        denom = np.sqrt(sq / np.maximum(count - ddof, 1.0)) + eps
        centred = centred / np.where(denom > 0, denom, 1.0)[gs]
    centred[count[gs] <= 1] = 0.0
    out = np.empty_like(centred)
    out[order] = centred
    return out
