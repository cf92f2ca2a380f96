"""One way to add and configure a mode of the resampling policy.

Every extension point of the policy (``selection``, ``screen``, ``group_validity``,
``stale_members``, ``replenish``, ``on_cap``) is a :class:`Registry`: a small base class and
the modes registered under it by name. A mode is one class with two class attributes:

* ``name``: the value of the policy field that picks it;
* ``Options``: its typed options, a :class:`ModeOptions` subclass (pydantic, unknown keys
  refused, defaults = the mode's source), empty when the mode has none.

Adding a mode is one file holding that class (and its options model), decorated with the
registry's ``register`` and imported by the module that collects the point's modes
(:mod:`orchestrator.core.modes` for the policy's modes, :mod:`orchestrator.core.selections`
for the task selections). The policy accepts exactly the registered names (its JSON schema lists
them as an enum) and validates a mode's options with :meth:`Registry.options`, so a misspelt or
misplaced option is refused when the policy is built, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.core.errors import field_path, short_repr


class ModeOptions(BaseModel):
    """Base of a mode's typed options: unknown keys refused, NaN and inf refused, immutable.

    A subclass declares its options as pydantic fields with their defaults and ranges (each
    default citing its source in the field's description)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Mode:
    """Base of every mode: the registry name and the typed options model (none by default)."""

    name: ClassVar[str] = "base"
    Options: ClassVar[type[ModeOptions]] = ModeOptions

    def __init__(self, options: ModeOptions | Mapping[str, Any] | None = None) -> None:
        """``options``: an instance of :attr:`Options`, or a mapping validated into one (None: the defaults).

        Raises:
            pydantic.ValidationError: an option the mode does not take, or out of its range.
        """
        self.options = options if isinstance(options, self.Options) else self.Options.model_validate(dict(options or {}))


M = TypeVar("M", bound=Mode)


class Registry(dict, Generic[M]):
    """Mode name -> mode class, for the policy field ``field``; modes subclass ``base``.

    Names are kept in registration order (the order the JSON schema and the docs list them in).
    """

    def __init__(self, field: str, base: type[M]) -> None:
        super().__init__()
        self.field, self.base = field, base

    def register(self, cls: type[M]) -> type[M]:
        """Class decorator: register ``cls`` under ``cls.name``.

        Raises:
            TypeError: ``cls`` does not subclass the extension point's base class, or its
                ``Options`` is not a :class:`ModeOptions` subclass.
            ValueError: another class is already registered under that name (registering the
                same class again is a no-op).
        """
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{self.field}: {cls!r} is not a subclass of {self.base.__qualname__}")
        if not (isinstance(cls.Options, type) and issubclass(cls.Options, ModeOptions)):
            raise TypeError(f"{self.field} {cls.name!r}: Options must subclass ModeOptions, got {cls.Options!r}")
        old = self.get(cls.name)
        if old is not None and old is not cls:
            raise ValueError(f"{self.field} {cls.name!r} is already registered ({old.__qualname__})")
        self[cls.name] = cls
        return cls

    def mode_class(self, name: str) -> type[M]:
        """The class registered as ``name``.

        Raises:
            ValueError: ``<field>: unknown mode <name>; registered: [...]``.
        """
        if name not in self:
            raise ValueError(f"{self.field}: unknown mode {short_repr(name)}; registered: {list(self)}")
        return self[name]

    def build(self, name: str, data: Mapping[str, Any] | ModeOptions | None = None) -> M:
        """A new mode ``name`` with its options from ``data`` (:meth:`options`; a mode whose
        constructor takes more, like a task selection, is built by its own factory)."""
        return self.mode_class(name)(self.options(name, data))

    def options(self, name: str, data: Mapping[str, Any] | ModeOptions | None = None) -> ModeOptions:
        """Mode ``name``'s typed options from ``data`` (None or empty: the defaults).

        Raises:
            ValueError: unknown mode, or an option the mode does not take or out of its range:
                ``<field>_options.<key>: <what is wrong> (got <value>); <field> <name> takes: ...``.
        """
        cls = self.mode_class(name)
        if isinstance(data, cls.Options):
            return data
        try:
            return cls.Options.model_validate(dict(data or {}))
        except ValidationError as err:
            takes = ", ".join(cls.Options.model_fields) or "no options"
            parts = []
            for e in err.errors():
                path = f"{self.field}_options." + field_path(e["loc"])
                msg = e["msg"].removeprefix("Value error, ")
                if e["type"] == "extra_forbidden":
                    owners = [n for n, c in self.items() if e["loc"][0] in c.Options.model_fields]
                    where = f" (an option of {self.field} {', '.join(map(repr, owners))})" if owners else ""
                    parts.append(f"{path}: not an option of {self.field} {name!r}{where}")
                else:
                    parts.append(f"{path}: {msg} (got {short_repr(e['input'])})")
            raise ValueError("; ".join(parts) + f"; {self.field} {name!r} takes: {takes}") from None
