"""The resampling policy: what the orchestrator keeps, drops, and regenerates.

One pydantic model, validated at construction and on every run-time change (REST, CLI).
Defaults follow the DAPO paper (arXiv 2503.14476, Sec. 3.2 and Table/Sec. 4.1) where it
speaks, and are otherwise the least surprising choice.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError, model_validator
from pydantic_core import PydanticCustomError, core_schema

from orchestrator.core.errors import describe_errors
from orchestrator.core.registry import Mode, ModeOptions


class InvalidPolicyError(ValueError):
    """A resampling policy value is out of range or inconsistent (names the field and value).

    Attributes:
        errors: per-field errors (``loc``, ``msg``, ``type``) when it came from validation, else None.
    """

    def __init__(self, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.errors = errors

    def __reduce__(self) -> tuple:  # keeps ``errors`` through pickling (Ray hands it to the REST service)
        return type(self), (str(self), self.errors)

    @classmethod
    def from_validation(cls, err: ValidationError) -> InvalidPolicyError:
        """Field, message and value of each error; an unknown key also lists the valid ones."""
        errors = err.errors()
        detail = [{"loc": list(e["loc"]), "msg": e["msg"].removeprefix("Value error, "), "type": e["type"]} for e in errors]
        return cls("invalid resampling policy: " + describe_errors(errors, root="policy") + valid_fields_hint(errors), detail)


def valid_fields_hint(errors: list[dict]) -> str:
    """``"; valid fields: ..."`` for each distinct level (policy or ``filter``) of an unknown
    field among pydantic ``errors`` (``extra_forbidden``), after where a field that moved went
    (:data:`MOVED_FIELDS`); else ``""``."""
    hint = ""
    for e in errors:
        old = e["loc"][-1] if e.get("type") == "extra_forbidden" and e.get("loc") else None
        if old in MOVED_FIELDS:
            field, mode, key, _ = MOVED_FIELDS[old]
            hint += f"; {old} moved to {field}_options.{key} (an option of {field} {mode!r})"
        elif old in OLD_SCREEN_SWITCHES:
            hint += f"; {old} is screen: {OLD_SCREEN_SWITCHES[old]!r} now"
    for nested in sorted({len(e["loc"]) == 2 and e["loc"][0] == "filter" for e in errors if e.get("type") == "extra_forbidden"}):
        fields = sorted((FilterConfig if nested else ResamplingPolicy).model_fields)
        hint += f"; valid {'filter.' if nested else ''}fields: {', '.join(fields)}"
    return hint


MOVED_FIELDS: dict[str, tuple[str, str, str, Any]] = {
    "selection_explore": ("selection", "informative", "explore", 0.01),
    "selection_sharpness": ("selection", "informative", "sharpness", 4.0),
    "selection_revisit_epochs": ("selection", "informative", "revisit_epochs", 8),
    "screen_skip_above": ("screen", "rollouts", "skip_above", 1.0),
    "screen_continue_above": ("screen", "rollouts", "continue_above", 1.0),
    "answer_keep_at": ("screen", "answer", "keep_at", 0.5),
    "answer_keep_power": ("screen", "answer", "keep_power", 4.0),
    "answer_reuse_versions": ("screen", "answer", "reuse_versions", 8),
    "answer_floor": ("screen", "answer", "floor", 0.0),
}
"""Old top-level policy fields that are a mode's options now: old name -> (mode field, mode,
option, the old field's default)."""
OLD_SCREEN_SWITCHES = {"screen_rollouts": "rollouts", "answer_screen": "answer"}
"""Old fields that turned a screen on (``screen_rollouts: k > 0``, ``answer_screen: true``) -> the screen mode."""


class Registered:
    """Metadata of a mode field (``Annotated[str, Registered(field)]``): the value must name a mode
    registered for the field (:data:`orchestrator.core.modes.MODES`), refused in the words of a
    ``Literal`` of the registered names (``Input should be 'pad', 'partial' or 'raise'``), and
    listed as one in the JSON schema (the REST API's) and the config tables."""

    def __init__(self, field: str) -> None:
        self.field = field

    def names(self) -> list[str]:
        """The registered names, in the order they were registered."""
        from orchestrator.core.modes import MODES  # here, so that the policy imports without the core's numerics

        return list(MODES[self.field])

    def validate(self, value: object) -> str:
        names = self.names()
        if isinstance(value, str) and value in names:
            return value
        quoted = list(map(repr, names))
        expected = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})

    def __get_pydantic_core_schema__(self, source: type, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.validate)

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return {"enum": self.names(), "type": "string"}

    def __str__(self) -> str:
        return "one of " + ", ".join(map(repr, self.names()))


MODE_FIELDS = ("selection", "screen", "group_validity", "stale_members", "replenish", "on_cap")
"""The policy fields that name a mode; each has a ``<field>_options`` field with the mode's options."""


def options_field(field: str) -> Any:
    """The ``<field>_options`` field of a mode field whose built-in modes take no options."""
    return Field(
        default_factory=dict,
        description=f"Options of the {field} mode, checked against its typed options model (orchestrator.core.modes); "
        f"the built-in {field} modes take none, so any key is refused.",
    )


class FilterConfig(BaseModel):
    """Which groups count as informative (DAPO Eq. 11, see ``algos.dapo.classify_groups``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    enabled: bool = Field(
        True, description="False keeps every valid group (no dynamic sampling: plain GRPO batching)."
    )
    judge: str = Field(
        "auto",
        description="Per-rollout value the filter judges: 'auto' (default: the unshaped outcome "
        "metrics['accuracy'] when every judged rollout of the group carries it, as DAPO's scorers "
        "do, else the reward), 'reward', or the name of a metric. Shaped rewards (overlong "
        "penalty) must not be judged: an all-wrong group would look informative and be trained "
        "on its shaping noise alone.",
        min_length=1,
    )
    std_tol: float = Field(
        1e-6, ge=0.0, le=1.0,
        description="Population std (float64) at or below which a group counts as all equal; "
        "0 means exact equality of the judged values (max == min).",
    )
    correct_threshold: float = Field(1.0, description="All-equal values >= this are 'all_correct' (DAPO rewards are +1/-1).")
    wrong_threshold: float = Field(0.0, description="All-equal values <= this are 'all_wrong'.")
    band: tuple[float, float] | None = Field(
        None, description="Optional band-pass (lo, hi) on the group mean: keep only lo < mean < hi."
    )

    @model_validator(mode="after")
    def _check(self) -> FilterConfig:
        if self.wrong_threshold > self.correct_threshold:
            raise ValueError(
                f"wrong_threshold ({self.wrong_threshold}) must be <= correct_threshold ({self.correct_threshold})"
            )
        if self.band is not None and not self.band[0] < self.band[1]:
            raise ValueError(f"band must satisfy lo < hi, got {self.band}")
        return self


class ResamplingPolicy(BaseModel):
    """Dynamic-sampling policy of one orchestrator (DAPO Sec. 3.2, plus run-time controls).

    DAPO's reference recipe keeps generating batches until ``train_batch_size`` informative
    groups exist (up to ``max_num_gen_batches``) and discards the surplus; we keep the
    surplus as carry-over and size each round by the predicted keep rate.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    target_groups: int = Field(8, ge=1, le=100_000, description="Informative groups per emitted train batch.")
    group_size: int = Field(8, ge=1, le=1024, description="Rollouts per group, n (DAPO uses 16).")
    filter: FilterConfig = Field(default_factory=FilterConfig)
    max_replenish_rounds: int = Field(
        0, ge=0, le=10_000,
        description="Replenish rounds allowed per batch after the initial round; 0 = unlimited "
        "(for none at all, use replenish='none').",
    )
    on_cap: Annotated[str, Registered("on_cap")] = Field(
        "pad",
        description="When the cap is hit (a mode of orchestrator.core.modes.ON_CAP): 'pad' fills with dropped "
        "groups marked as padding (zero loss weight), 'partial' emits a smaller batch flagged partial, 'raise' "
        "raises ReplenishCapError.",
    )
    on_cap_options: dict[str, Any] = options_field("on_cap")
    replenish: Annotated[str, Registered("replenish")] = Field(
        "fresh_tasks",
        description="Which tasks replenish rounds roll out (a mode of orchestrator.core.modes.REPLENISH): "
        "'fresh_tasks' draws new prompts (as the DAPO paper); 'same_tasks' re-rolls the "
        "prompts dropped in this batch, topped up with fresh ones; 'none' is filter-only: "
        "uninformative groups are dropped and nothing is replenished (each batch closes after its "
        "initial round, per on_cap). Default 'fresh_tasks', or 'none' when filter.enabled is false "
        "(nothing is dropped by the filter to replenish; 'fresh_tasks' is then refused).",
    )
    replenish_options: dict[str, Any] = options_field("replenish")
    min_keep_rate: float = Field(
        0.1, gt=0.0, le=1.0, description="Floor on the predicted keep rate used to size a round (caps over-generation)."
    )
    max_tasks_per_round: int = Field(256, ge=1, le=1_000_000, description="Upper bound on tasks requested in one round.")
    skip_after_all_correct: int = Field(0, ge=0, description="Skip a task after this many consecutive all-correct groups; 0 = never.")
    skip_after_all_wrong: int = Field(0, ge=0, description="Skip a task after this many consecutive all-wrong groups; 0 = never.")
    cooldown_epochs: int = Field(1, ge=1, le=10_000, description="Epochs a skipped task sits out.")
    max_staleness: int | None = Field(
        None, ge=0,
        description="Staleness bound in model versions. A rollout's lag is the orchestrator's model "
        "version when its batch is assembled minus the model version that produced it; a lag above "
        "max_staleness is stale (lag == max_staleness is fresh). None = never stale.",
    )
    stale_members: Annotated[str, Registered("stale_members")] = Field(
        "oldest",
        description="What a group with stale members gets (a mode of orchestrator.core.modes.STALE_MEMBERS): "
        "'oldest': a group's oldest member decides, the whole group is dropped as 'stale'; "
        "'mask': stale members get zero loss weight and leave the baseline, the group stays while "
        "min_valid_group_size members remain and still differ.",
    )
    stale_members_options: dict[str, Any] = options_field("stale_members")
    requeue_stale: bool = Field(
        False, description="Roll the task of a group dropped as stale again in the next round (else it waits for its epoch)."
    )
    group_validity: Annotated[str, Registered("group_validity")] = Field(
        "reject",
        description="A group with a NaN/inf/missing reward or judged value, or fewer than group_size "
        "rollouts (a mode of orchestrator.core.modes.GROUP_VALIDITY): 'reject' refuses it whole; 'mask' gives "
        "those members zero loss weight, leaves them out of the filter and the baseline, and keeps the group "
        "when min_valid_group_size remain.",
    )
    group_validity_options: dict[str, Any] = options_field("group_validity")
    min_valid_group_size: int = Field(
        2, ge=2, le=1024, description="Valid members a group needs under group_validity='mask' (and stale_members='mask')."
    )
    max_epochs: int | None = Field(
        None, ge=1, description="Stop drawing tasks after this many passes over the task set; None = never stop."
    )
    max_rollouts: int | None = Field(
        None, ge=1, description="Rollout budget: no round is planned past this many rollouts in total; None = unlimited."
    )
    max_abs_reward: float = Field(
        1e6, gt=0.0, le=1e12, description="Largest |reward| accepted in a submitted group; a larger one is refused "
        "as a bug upstream (it would overflow the group statistics)."
    )
    replenish_paused: bool = Field(False, description="When True, no replenish round is started (the initial round still is).")
    selection: Annotated[str, Registered("selection")] = Field(
        "epoch",
        description="How tasks are chosen (a mode of orchestrator.core.selection.SELECTIONS, its options in "
        "selection_options): 'epoch' walks a seeded permutation per epoch (minus skip-rule cooldowns); 'informative' "
        "draws tasks by their predicted chance of an informative group (per-task Beta pass-rate posterior), with "
        "exploration and a revisit bound, and sizes each round from the predicted keep rate of the tasks drawn; "
        "'greso' is the epoch order with GRESO's probabilistic skip of recently zero-variance tasks (arXiv "
        "2506.02177); 'predicted_skip' is the epoch order keeping each task with probability clip(I / keep_at, floor, "
        "1) of its predicted chance I of an informative group (own history and family prior); 'greso_prior' uses "
        "GRESO's skip for tasks rolled out before and predicted_skip's for the others (docs/reference/sampling.md).",
    )
    selection_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the active selection mode, checked against its typed options model (e.g. "
        "'informative': explore, sharpness, revisit_epochs; 'greso': p_start, step, p_min, target_zero_share, "
        "easy_share; 'predicted_skip': keep_at, floor); an option the mode does not take is refused. Changing "
        "selection without giving selection_options starts the new mode at its defaults.",
    )
    screen: Annotated[str, Registered("screen")] = Field(
        "none",
        description="What a planned round's tasks go through before their full group (a mode of "
        "orchestrator.core.screens.SCREENS, its options in screen_options): 'none'; 'rollouts' (SPEED-RL, arXiv "
        "2506.09016): roll screen_options.rollouts of each task first and complete the group only when they are "
        "not all equal; 'answer': score each task's reference answer under the current policy (one forward pass, "
        "nothing sampled; a rollout source that can score, vLLM) and roll the task out with probability "
        "clip((I / keep_at) ** keep_power, floor, 1). Standalone route only (docs/reference/sampling.md).",
    )
    screen_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the active screen, checked against its typed options model ('rollouts': rollouts, "
        "skip_above, continue_above; 'answer': keep_at, keep_power, reuse_versions, floor).",
    )
    passrate_half_life: float | None = Field(
        16.0, gt=0.0,
        description="Model versions after which a task's pass-rate evidence counts half (the model changes); "
        "None = never forget.",
    )
    passrate_trained_discount: float = Field(
        0.25, ge=0.0, le=1.0,
        description="Factor on a task's pass-rate evidence each time one of its groups is emitted for training "
        "(training moves that task's pass rate most); 1 = only the half-life forgets.",
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_fields(cls, data: object) -> object:
        """Old configs keep loading. ``screen_rollouts: k`` (k > 0) is ``screen: rollouts`` with
        ``screen_options.rollouts: k``, ``answer_screen: true`` is ``screen: answer`` (0 / false
        turn the screen named off); an old option field (:data:`MOVED_FIELDS`) moves into its mode's
        ``<field>_options`` (over a value there) when its mode is active, is dropped at its old
        default (a dump of an old policy carries them all), and is refused otherwise, saying what
        to write."""
        if not isinstance(data, dict) or not (MOVED_FIELDS.keys() | OLD_SCREEN_SWITCHES.keys()) & data.keys():
            return data
        data = dict(data)
        on = []
        for old, mode in OLD_SCREEN_SWITCHES.items():
            if old not in data:
                continue
            value = data.pop(old)
            if value:
                on.append((old, mode, {"rollouts": value} if mode == "rollouts" else {}))
            elif data.get("screen") == mode:  # a change turning it off
                data["screen"], data["screen_options"] = "none", {}
        if len(on) > 1:
            raise ValueError("screen_rollouts and answer_screen: one screen at a time; write screen: rollouts (with "
                             "screen_options: {rollouts: k}) or screen: answer")
        if on:
            old, mode, options = on[0]
            if data.get("screen", mode) not in (mode, "none"):
                raise ValueError(f"{old}: turns on screen {mode!r}, but screen is {data['screen']!r}; write screen: {mode}")
            if data.get("screen") != mode:
                data["screen_options"] = {}
            data["screen"] = mode
            data["screen_options"] = {**(data.get("screen_options") or {}), **options}
        for old, (field, mode, key, default) in MOVED_FIELDS.items():
            if old not in data:
                continue
            value = data.pop(old)
            active = data.get(field, cls.model_fields[field].default)
            if active == mode:
                data[f"{field}_options"] = {**(data.get(f"{field}_options") or {}), key: value}
            elif value != default:
                raise ValueError(f"{old}: moved to {field}_options.{key}, an option of {field} {mode!r} ({field} is "
                                 f"{active!r}); write {field}: {mode}, {field}_options: {{{key}: {value!r}}}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _replenish_default(cls, data: object) -> object:
        """Without a ``replenish`` given, a policy whose filter is off replenishes nothing."""
        if isinstance(data, dict) and "replenish" not in data:
            f = data.get("filter")
            enabled = f.get("enabled", True) if isinstance(f, dict) else getattr(f, "enabled", True)
            if enabled is False:
                data = {**data, "replenish": "none"}
        return data

    @model_validator(mode="after")
    def _cross_fields(self) -> ResamplingPolicy:
        if not self.filter.enabled and self.replenish == "fresh_tasks":
            raise ValueError(
                "replenish: 'fresh_tasks' with filter.enabled: false: the filter drops no group, so there is nothing "
                "to replenish; set replenish to 'none' (or enable the filter)"
            )
        if self.group_size == 1 and self.filter.enabled:
            raise ValueError(
                "group_size: 1 with filter.enabled makes every group a singleton (zero variance, always dropped); "
                "use group_size >= 2 or filter.enabled=false"
            )
        if self.min_valid_group_size > self.group_size and (self.group_validity == "mask" or self.stale_members == "mask"):
            raise ValueError(
                f"min_valid_group_size ({self.min_valid_group_size}) must be <= group_size ({self.group_size}) "
                "when group_validity or stale_members is 'mask' (the only settings that use it)"
            )
        for field in MODE_FIELDS:
            self.mode_options(field)  # refuses an option the mode does not take, naming it
        if self.screen == "rollouts" and not self.mode_options("screen").rollouts < self.group_size:
            raise ValueError(f"screen_options.rollouts ({self.mode_options('screen').rollouts}) must be < group_size "
                             f"({self.group_size}) (a screen rolls part of a group; screen: none turns screening off)")
        if self.max_rollouts is not None and self.max_rollouts < self.group_size:
            raise ValueError(f"max_rollouts ({self.max_rollouts}) must be >= group_size ({self.group_size})")
        return self

    def mode_options(self, field: str) -> ModeOptions:
        """The typed options of the mode that policy field ``field`` (one of :data:`MODE_FIELDS`)
        names, from ``<field>_options``.

        Raises:
            ValueError: an option the mode does not take, or out of its range, naming it.
        """
        from orchestrator.core.modes import MODES  # here, so that the policy imports without the core's numerics

        return MODES[field].options(getattr(self, field), getattr(self, f"{field}_options"))

    def mode(self, field: str) -> Mode:
        """A new instance of the (stateless) mode that policy field ``field`` names, with its options
        (``group_validity``, ``stale_members``, ``replenish``, ``on_cap``; a selection, which holds
        state, is built by :func:`orchestrator.core.selections.make_selection`)."""
        from orchestrator.core.modes import MODES

        return MODES[field].build(getattr(self, field), self.mode_options(field))

    @classmethod
    def parse(cls, data: dict) -> ResamplingPolicy:
        """Build from a dict, raising :class:`InvalidPolicyError` (field and value named)."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise InvalidPolicyError.from_validation(err) from None

    def updated(self, changes: dict) -> ResamplingPolicy:
        """A copy with ``changes`` merged (nested ``filter`` merged key by key), validated. A change
        of a mode (``selection``, ``on_cap``, ...) without its ``<field>_options`` drops the old
        mode's options."""
        data = self.model_dump()
        for field in MODE_FIELDS:
            if changes.get(field, data[field]) != data[field] and f"{field}_options" not in changes:
                data[f"{field}_options"] = {}  # the new mode starts at its defaults
        for key, value in changes.items():
            if key == "filter" and isinstance(value, dict):
                data["filter"] = {**data["filter"], **value}
            else:
                data[key] = value
        return self.parse(data)
