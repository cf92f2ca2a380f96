"""A task set: tasks by id, with their scorer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from orchestrator.core.types import InvalidTaskError, Task, UnknownTaskError
from orchestrator.tasks.scoring import score_response


class TaskSet:
    """An ordered, immutable collection of tasks with unique ids, and their scorer.

    Args:
        tasks: the tasks, in the order of :attr:`task_ids`.
    Raises:
        InvalidTaskError: two tasks share an id (names it), or a task has an empty prompt.
    """

    def __init__(self, tasks: Iterable[Task]):
        self._tasks: dict[str, Task] = {}
        for task in tasks:
            if task.task_id in self._tasks:
                raise InvalidTaskError(f"duplicate task_id {task.task_id!r}")
            if not task.prompt:
                raise InvalidTaskError(f"task {task.task_id!r}: empty prompt")
            self._tasks[task.task_id] = task
        self.task_ids: list[str] = list(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self):
        return iter(self._tasks.values())

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def get(self, task_id: str) -> Task:
        """The task with id ``task_id``.

        Raises:
            UnknownTaskError: no such task (the message names the id and the set size).
        """
        try:
            return self._tasks[task_id]
        except KeyError:
            raise UnknownTaskError(
                f"unknown task_id {task_id!r} (task set holds {len(self._tasks)} tasks)"
            ) from None

    def kinds(self) -> dict[str, int]:
        """Number of tasks per ``Task.kind``, in first-seen order."""
        counts: dict[str, int] = {}
        for task in self._tasks.values():
            counts[task.kind] = counts.get(task.kind, 0) + 1
        return counts

    def score(self, task: Task, response_text: str) -> tuple[float, dict[str, float]]:
        """DAPO rule reward (+1 correct / -1 wrong) and ``{"accuracy": 1.0 | 0.0}``.

        See :func:`score_response` for the extraction rules and the errors raised.
        """
        return score_response(task, response_text)


@dataclass
class IndexTaskSet:
    """The task set of a Trinity-driven orchestrator: ids only (Trinity owns the prompts).

    Attributes:
        task_ids: ``"0" .. str(N - 1)``, the rows of the training taskset.
    """

    task_ids: list[str] = field(default_factory=list)

    @classmethod
    def of_size(cls, n: int) -> IndexTaskSet:
        if n <= 0:
            raise ValueError(f"num_tasks: must be > 0, got {n}")
        return cls(_index_ids(n))

    def get(self, task_id: str):
        raise LookupError(f"task {task_id!r}: Trinity's explorer owns the prompts; this orchestrator has no rollout source")

    def __reduce__(self) -> tuple:
        # pickled as its size when the ids are "0".."N-1" (always, from of_size): a few bytes
        # whatever N. The orchestrator is created with it as a constructor argument, and Ray
        # keeps an argument above ~100 KB (about 15,000 ids) in its object store, owned by the
        # creating process (Trinity's explorer): once that process is gone, Ray could not
        # restart the detached actor after a crash (the argument is lost with its owner).
        n = len(self.task_ids)
        if n and self.task_ids[0] == "0" and self.task_ids[-1] == str(n - 1) and self.task_ids == _index_ids(n):
            return IndexTaskSet.of_size, (n,)
        return IndexTaskSet, (list(self.task_ids),)


def _index_ids(n: int) -> list[str]:
    return list(map(str, range(n)))


def prompt_texts(task_set) -> list[str] | None:
    """Each task's prompt text (its messages' contents joined by newlines), in task order, from a
    task set that holds its tasks; None for one that does not (:class:`IndexTaskSet`) or whose
    tasks have no message list."""
    if not hasattr(task_set, "__iter__"):
        return None
    prompts = [getattr(t, "prompt", None) for t in task_set]
    if not all(isinstance(p, list) for p in prompts):
        return None
    return ["\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in p) for p in prompts]
