"""Shared commits (:class:`SharedCommits`, a database's group commit) alone: who shares a commit, and what a failed one does."""

import asyncio

from orchestrator.service.commits import SharedCommits


def five_calls(fail_on: int | None = None):
    """Five concurrent calls, each counting one change and awaiting its commit; returns what
    each call got, the change count each write covered, and how often it rolled back."""
    writes, rollbacks = [], []

    def prepare():
        upto = commits.pending

        def write():
            if len(writes) == fail_on:
                writes.append(f"failed {upto}")
                raise OSError("disk full")
            writes.append(upto)

        return write, lambda: None

    commits = SharedCommits(prepare, rollback=lambda: rollbacks.append(1))

    async def call():
        await commits.durable(commits.changed())

    async def main():
        return await asyncio.gather(*(call() for _ in range(5)), return_exceptions=True)

    return asyncio.run(main()), writes, len(rollbacks)


def test_calls_made_while_a_commit_is_written_share_the_next_one():
    answers, writes, rollbacks = five_calls()
    assert answers == [None] * 5 and writes == [1, 5] and rollbacks == 0  # the first alone, then the four that waited


def test_a_failed_commit_rolls_back_and_fails_every_call_it_held():
    answers, writes, rollbacks = five_calls(fail_on=1)
    assert writes == [1, "failed 5"] and rollbacks == 1
    assert answers[0] is None and isinstance(answers[1], OSError)  # the call that wrote it gets the error itself
    assert all(isinstance(a, RuntimeError) and "rolled back" in str(a) for a in answers[2:])
