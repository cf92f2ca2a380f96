"""Task sets and their rule-based scorers (orchestrator.tasks.generators)."""

from __future__ import annotations

import pickle

import pytest
from ray import cloudpickle

from orchestrator.core.types import InvalidTaskError, Task, UnknownTaskError
from orchestrator.tasks.generators import default_task_set, gen_champ, gen_copy, gen_rg_syllogism
from orchestrator.tasks.scoring import extract_choice, extract_number, extract_yes_no, score_response
from orchestrator.tasks.taskset import IndexTaskSet, TaskSet


def _task(answer: str, fmt: str, kind: str = "t") -> Task:
    return Task("t-0", [{"role": "user", "content": "?"}], answer, kind, {"format": fmt})


# ----------------------------------------------------------------- extraction


def test_yes_no_takes_first_word_after_punctuation():
    assert extract_yes_no("**Yes**, 12 is even.") == "yes"


def test_yes_no_rejects_other_first_word():
    assert extract_yes_no("The answer is yes") is None


def test_number_takes_first_number_without_thousands_separator():
    assert extract_number("It is 1,234 and not 5") == "1234"


def test_number_keeps_sign():
    assert extract_number("Result: -4.") == "-4"


def test_number_none_without_digits():
    assert extract_number("seven") is None


def test_choice_takes_first_standalone_letter():
    assert extract_choice("The correct option is (C) 13") == "C"


def test_choice_ignores_letters_inside_words():
    assert extract_choice("Bad") is None


# ----------------------------------------------------------------- scoring


def test_yes_no_correct_scores_plus_one():
    assert score_response(_task("no", "yes_no"), "No, 7 is odd.") == (1.0, {"accuracy": 1.0})


def test_yes_no_wrong_scores_minus_one():
    assert score_response(_task("no", "yes_no"), "Yes.") == (-1.0, {"accuracy": 0.0})


def test_unparsable_response_scores_minus_one():
    assert score_response(_task("97", "number"), "I cannot tell.") == (-1.0, {"accuracy": 0.0})


def test_number_compares_values_not_strings():
    assert score_response(_task("6", "number"), "6.0 is the result")[0] == 1.0


def test_number_uses_first_number_only():
    # "53 or 97" -> 53, wrong although 97 appears later
    assert score_response(_task("97", "number"), "53 or 97")[0] == -1.0


def test_choice_correct_letter():
    assert score_response(_task("B", "choice"), "B) 13")[0] == 1.0


def test_choice_wrong_letter():
    assert score_response(_task("B", "choice"), "A) 14")[0] == -1.0


def test_math_format_uses_math_verify_on_integers():
    assert score_response(_task("239", "math"), "There are 239 such strings.")[0] == 1.0


def test_math_format_wrong_integer():
    assert score_response(_task("239", "math"), "240")[0] == -1.0


def test_math_format_yes_no_reference_uses_first_word():
    assert score_response(_task("No", "math"), "no such polyhedron")[0] == 1.0


def test_unknown_format_raises_naming_task():
    with pytest.raises(InvalidTaskError, match="t-0"):
        score_response(_task("1", "essay"), "1")


def test_reasoning_gym_task_uses_its_scorer():
    task = gen_rg_syllogism(0, 1)[0]
    expected = task.answer  # "Yes" or "No"
    other = "No" if expected == "Yes" else "Yes"
    assert (score_response(task, f"{expected.lower()}!")[0], score_response(task, other)[0]) == (1.0, -1.0)


def test_champ_tasks_have_integer_or_yes_no_answers():
    answers = [t.answer for t in gen_champ(0, 200)]
    assert len(answers) == 112 and all(a.lstrip("-").isdigit() or a in ("Yes", "No") for a in answers)


# ----------------------------------------------------------------- task sets


def test_same_seed_gives_same_tasks():
    a, b = default_task_set(seed=3, size=60), default_task_set(seed=3, size=60)
    assert [(t.task_id, t.prompt, t.answer) for t in a] == [(t.task_id, t.prompt, t.answer) for t in b]


def test_different_seed_gives_different_prompts():
    a, b = default_task_set(seed=0, size=60), default_task_set(seed=1, size=60)
    assert [t.prompt for t in a] != [t.prompt for t in b]


def test_default_task_set_has_requested_size_and_unique_ids():
    ts = default_task_set(seed=0, size=57)
    assert len(ts) == 57 and len(set(ts.task_ids)) == 57


def test_mix_split_by_largest_remainder():
    # 10 tasks over weights 1:1:1 -> 4, 3, 3 (the first kind gets the spare task)
    ts = default_task_set(seed=0, size=10, mix={"parity": 1, "compare": 1, "mcq": 1})
    assert ts.kinds() == {"parity": 4, "compare": 3, "mcq": 3}


def test_get_returns_task_by_id():
    ts = default_task_set(seed=0, size=20)
    assert ts.get(ts.task_ids[5]).task_id == ts.task_ids[5]


def test_unknown_task_id_raises_naming_it():
    ts = default_task_set(seed=0, size=5)
    with pytest.raises(UnknownTaskError, match="nope-1"):
        ts.get("nope-1")


def test_unknown_task_error_is_key_and_value_error():
    assert issubclass(UnknownTaskError, KeyError) and issubclass(UnknownTaskError, ValueError)


def test_duplicate_ids_rejected():
    with pytest.raises(InvalidTaskError, match="t-0"):
        TaskSet([_task("1", "number"), _task("2", "number")])


def test_unknown_kind_in_mix_rejected():
    with pytest.raises(InvalidTaskError, match="poetry"):
        default_task_set(seed=0, size=5, mix={"poetry": 1.0})


def test_parity_answer_matches_question():
    ts = default_task_set(seed=0, size=40, mix={"parity": 1.0})
    for t in ts:
        n, asked = t.meta["n"], t.prompt[0]["content"].split()[3]
        assert t.answer == ("yes" if (n % 2 == 0) == (asked == "even") else "no")


def test_copy_prompt_ends_with_the_question_after_example_turns():
    task = gen_copy(0, 1)[0]
    assert [m["role"] for m in task.prompt] == ["user", "assistant"] * 3 + ["user"]
    assert task.prompt[-1]["content"] == f"Repeat this number: {task.answer}."


def test_default_mix_covers_every_generator():
    from orchestrator.tasks.generators import DEFAULT_MIX, GENERATORS

    assert set(DEFAULT_MIX) == set(GENERATORS)


def test_an_index_task_set_pickles_as_its_size():
    big = IndexTaskSet.of_size(100_000)
    data = cloudpickle.dumps(big)
    assert len(data) < 2_000 and cloudpickle.loads(data) == big  # the ids would take ~790 KB


def test_an_index_task_set_of_other_ids_pickles_them():
    odd = IndexTaskSet(["0", "2", "1"])
    assert pickle.loads(pickle.dumps(odd)).task_ids == ["0", "2", "1"]


# ----------------------------------------------------------------- final answer after reasoning


def test_final_number_reads_only_after_the_last_mark():
    from orchestrator.tasks.scoring import extract_final_number

    assert extract_final_number("21,43#46") == "46"
    assert extract_final_number("1#2#3") == "3"


def test_final_number_is_none_without_a_mark_or_a_number_after_it():
    from orchestrator.tasks.scoring import extract_final_number

    assert extract_final_number("46") is None and extract_final_number("12,34#") is None


def test_final_number_scores_the_answer_whatever_the_reasoning():
    # the reasoning holds the right sum and a wrong one: only the number after '#' counts
    assert score_response(_task("46", "final_number"), "46,99#46")[0] == 1.0
    assert score_response(_task("46", "final_number"), "46,46#45")[0] == -1.0
    assert score_response(_task("46", "final_number"), "46")[0] == -1.0  # no mark: no final answer
