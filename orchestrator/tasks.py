"""Task sets: prompts with reference answers and a scorer (placeholder, being written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Task:
    """One prompt (or environment instance) with what is needed to score a response.

    Attributes:
        task_id: stable, unique id within its task set.
        prompt: the chat messages (``[{"role": ..., "content": ...}]``) sent to the model.
        answer: the reference answer.
        kind: the family the task comes from (e.g. ``parity``, ``champ``), used for scoring.
        meta: anything else the scorer needs.
    """

    task_id: str
    prompt: list[dict[str, str]]
    answer: str
    kind: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
