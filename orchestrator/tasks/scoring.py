"""Scoring: answer extraction and DAPO's rule-based outcome reward (arXiv 2503.14476, Sec. 2.4, Eq. 7)."""

from __future__ import annotations

import re
from functools import lru_cache

from orchestrator.core.types import InvalidTaskError, Task

CORRECT_REWARD = 1.0
"""DAPO rule reward for an equivalent answer (Eq. 7)."""
WRONG_REWARD = -1.0
"""DAPO rule reward for any other answer, unparsable ones included (Eq. 7)."""

ANSWER_FORMATS = ("yes_no", "number", "choice", "math", "final_number")
"""Values of ``Task.meta["format"]``: how the answer is extracted and compared."""

FINAL_MARK = "#"
"""What separates a response's reasoning from its final answer in the ``final_number`` format
(GSM8K's solutions end ``#### <answer>``; one ``#`` here, a character of the tiny vocabulary)."""


# --------------------------------------------------------------------------- extraction

_WORD = re.compile(r"[A-Za-z]+")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_CHOICE = re.compile(r"(?<![A-Za-z])([A-D])(?![A-Za-z])")


def extract_yes_no(text: str) -> str | None:
    """First word of ``text`` if it is yes or no, lower-cased.

    Punctuation and markdown before the word are skipped (``"**Yes**, because"`` -> ``"yes"``).

    Returns:
        ``"yes"``, ``"no"`` or None (first word is something else, or no word at all).
    """
    m = _WORD.search(text)
    if m is None:
        return None
    word = m.group(0).lower()
    return word if word in ("yes", "no") else None


def extract_number(text: str) -> str | None:
    """First number in ``text``, thousands separators removed.

    ``"The answer is 1,234."`` -> ``"1234"``; ``"-7 apples"`` -> ``"-7"``; ``"3.50"`` -> ``"3.50"``.

    Returns:
        The number as written (without commas), or None when there is no digit.
    """
    m = _NUMBER.search(text)
    return None if m is None else m.group(0).replace(",", "")


def extract_final_number(text: str) -> str | None:
    """The number right after the last :data:`FINAL_MARK` of ``text``: the final answer of a
    response that reasons first (GSM8K's ``#### 42`` convention); what comes before the mark is
    never read. ``"12,34#46"`` -> ``"46"``; ``"7,9#"`` -> None; ``"46"`` (no mark) -> None.

    Returns:
        The number as written (commas removed, as :func:`extract_number`), or None when there is no
        mark or no number right after the last one.
    """
    head, mark, tail = text.rpartition(FINAL_MARK)
    if not mark:
        return None
    m = _NUMBER.match(tail.strip())
    return None if m is None else m.group(0).replace(",", "")


def extract_choice(text: str) -> str | None:
    """First standalone capital letter A-D in ``text`` (``"(B) 7"`` -> ``"B"``, ``"Answer: C"`` -> ``"C"``).

    A sentence-initial article "A" counts as the letter A: the lenient rule accepts that noise.

    Returns:
        One of ``"A".."D"``, or None.
    """
    m = _CHOICE.search(text)
    return None if m is None else m.group(1)


def _numbers_equal(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


@lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    import math_verify

    return math_verify.parse(f"${answer}$", parsing_timeout=None)


def _math_equal(answer: str, response: str) -> bool:
    """math-verify equivalence of the whole response against the reference answer.

    Timeouts are disabled: math-verify implements them with ``signal.alarm``, which works only
    in a process's main thread (Ray actors may call this from another thread).
    """
    import math_verify

    gold = _parse_gold(answer)
    pred = math_verify.parse(response, parsing_timeout=None)
    if not gold or not pred:
        return False
    return bool(math_verify.verify(gold, pred, timeout_seconds=None))


def _rg_score(task: Task, extracted: str) -> bool:
    import reasoning_gym

    score_fn = reasoning_gym.get_score_answer_fn(task.meta["rg_dataset"])
    return float(score_fn(extracted, task.meta["rg_entry"])) >= 1.0


def score_response(task: Task, response_text: str) -> tuple[float, dict[str, float]]:
    """DAPO rule reward of one response (arXiv 2503.14476, Sec. 2.4, Eq. 7).

    Extraction by ``task.meta["format"]``: ``yes_no`` (first word), ``number`` (first number,
    compared as floats), ``final_number`` (the number after the last ``#``, compared as floats;
    the reasoning before it is not read), ``choice`` (first letter A-D), ``math`` (math-verify of the whole
    response against the reference; a Yes/No reference uses the first word). Tasks with
    ``meta["rg_dataset"]`` hand the extracted answer (``"Yes"``/``"No"`` capitalised) to
    reasoning-gym's own scorer for that dataset and count a score of 1.0 as correct.

    Args:
        task: the task (its ``answer`` and ``meta``).
        response_text: the decoded response (no prompt).
    Returns:
        ``(reward, metrics)``: reward is +1.0 (correct) or -1.0 (wrong or unparsable);
        metrics is ``{"accuracy": 1.0 or 0.0}``.
    Raises:
        InvalidTaskError: ``meta["format"]`` is not one of :data:`ANSWER_FORMATS` (names the task).
    """
    fmt = task.answer_format
    if fmt not in ANSWER_FORMATS:
        raise InvalidTaskError(
            f"task {task.task_id!r}: meta['format']={fmt!r} is not one of {ANSWER_FORMATS}"
        )
    reference = task.answer.strip()
    if fmt == "math" and reference.lower() in ("yes", "no"):
        fmt = "yes_no"
    if fmt == "yes_no":
        got = extract_yes_no(response_text)
        extracted = None if got is None else got.capitalize()
        same = lambda: got == reference.lower()
    elif fmt in ("number", "final_number"):
        extracted = (extract_number if fmt == "number" else extract_final_number)(response_text)
        same = lambda: extracted is not None and _numbers_equal(extracted, reference)
    elif fmt == "choice":
        extracted = extract_choice(response_text)
        same = lambda: extracted == reference.upper()
    else:
        extracted = response_text
        same = lambda: _math_equal(reference, response_text)
    if extracted is None:
        correct = False
    elif "rg_dataset" in task.meta:
        correct = _rg_score(task, extracted)
    else:
        correct = same()
    return (CORRECT_REWARD if correct else WRONG_REWARD), {"accuracy": 1.0 if correct else 0.0}


