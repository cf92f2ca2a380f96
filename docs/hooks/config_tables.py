"""MkDocs hook: configuration reference tables generated from the pydantic models at build time.

A page asks for a model's table with a marker line of its own::

    <!-- config-table: orchestrator.core.policy:ResamplingPolicy -->

and the hook replaces it with a heading (anchor ``config-<model name in lower case>``), the
model's docstring, one row per field (name, type, default, constraints, description) and the
docstrings of its checks across fields. A field's description is its ``Field(description=...)``,
else its entry in the class docstring's ``Attributes:`` section. A field whose type is another
documented model links to that model's table, wherever it is. The tables are read from the
models each time the site is built, so they cannot go stale; a marker naming a model that does
not import fails the build.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"^<!--\s*config-table:\s*([\w.]+):(\w+)\s*-->\s*$", re.MULTILINE)

# model class -> (page path relative to docs_dir, anchor): filled from the markers in on_files
_WHERE: dict[type, tuple[str, str]] = {}


def anchor(model: type) -> str:
    return "config-" + model.__name__.lower()


def load(module: str, name: str) -> type[BaseModel]:
    """The model ``module:name``; a clear error when it is missing or not a pydantic model."""
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise RuntimeError(f"config-table: cannot import {module}:{name} ({err})") from err
    if not (inspect.isclass(obj) and issubclass(obj, BaseModel)):
        raise RuntimeError(f"config-table: {module}:{name} is not a pydantic model")
    return obj


# --------------------------------------------------------------------------- docstrings


def _rst_to_md(text: str) -> str:
    """The reStructuredText bits our docstrings use, as Markdown: ``x`` -> `x`, :role:`~a.b` -> `b`."""
    text = re.sub(
        r":\w+:`~?([^`]+)`", lambda m: "`" + (m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1)) + "`", text
    )
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _sections(model: type) -> tuple[str, dict[str, str]]:
    """(intro, {attribute: description}) of a Google-style class docstring."""
    doc = inspect.cleandoc(model.__doc__ or "")
    intro, attrs, current, in_attrs = [], {}, None, False
    for line in doc.splitlines():
        if re.match(r"^(Attributes|Args|Arguments|Raises|Returns|Example|Examples):\s*$", line):
            in_attrs = line.startswith("Attributes")
            current = None
            continue
        if in_attrs:
            m = re.match(r"^    (\w+)(?: \([^)]*\))?:\s*(.*)$", line)
            if m:
                current = m.group(1)
                attrs[current] = m.group(2)
            elif current and line.strip():
                attrs[current] += " " + line.strip()
        elif not attrs:
            intro.append(line)
    return _rst_to_md("\n".join(intro).strip()), {k: _rst_to_md(v) for k, v in attrs.items()}


# --------------------------------------------------------------------------- cells


def _model_link(model: type, page: str) -> str:
    where = _WHERE.get(model)
    if where is None:
        return f"`{model.__name__}`"
    target_page, name = where
    if target_page == page:
        return f"[`{model.__name__}`](#{name})"
    return f"[`{model.__name__}`]({_relative(page, target_page)}#{name})"


def _relative(src: str, dst: str) -> str:
    """Link from page ``src`` to page ``dst`` (both relative to docs_dir, POSIX)."""
    src_parts, dst_parts = Path(src).parent.parts, Path(dst).parts
    common = 0
    while common < min(len(src_parts), len(dst_parts) - 1) and src_parts[common] == dst_parts[common]:
        common += 1
    return "/".join([".."] * (len(src_parts) - common) + list(dst_parts[common:]))


def type_text(tp: Any, page: str = "") -> str:
    """A short Markdown rendering of a type annotation, with links to documented models."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None) or tp is None:
        return "`null`"
    if origin is typing.Annotated:
        return type_text(args[0], page)
    if origin is typing.Literal:
        return " \\| ".join(f"`{json.dumps(a) if isinstance(a, str) else a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_text(a, page) for a in args)
    if origin is not None and args:
        return f"`{plain_type(tp)}`"
    if _is_model(tp):
        return _model_link(tp, page)
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return " \\| ".join(f"`{m.value!r}`" for m in tp)
    if inspect.isclass(tp):
        return f"`{tp.__name__}`"
    return f"`{str(tp).replace('typing.', '')}`"


def plain_type(tp: Any) -> str:
    """A type annotation as plain text (inside a generic, where Markdown cannot nest)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None) or tp is None:
        return "None"
    if tp is Ellipsis:
        return "..."
    if origin is typing.Annotated:
        return plain_type(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(plain_type(a) for a in args)
    if origin is not None and args:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(plain_type(a) for a in args)}]"
    if inspect.isclass(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _value(v: Any) -> str:
    if isinstance(v, enum.Enum):
        v = v.value
    if isinstance(v, BaseModel):
        v = v.model_dump(mode="json")
    if isinstance(v, Path):
        v = str(v)
    try:
        text = json.dumps(v, default=str)
    except (TypeError, ValueError):
        text = repr(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        text = _number(v)
    return f"`{text}`"


def _changed(model: type[BaseModel], value: BaseModel) -> dict:
    """Fields of ``value`` that differ from ``model()``'s defaults, nested with dots."""
    try:
        base = model().model_dump(mode="json")
    except Exception:  # a model with required fields has no defaults to compare with
        return value.model_dump(mode="json")
    out: dict = {}

    def walk(a: dict, b: dict, prefix: str) -> None:
        for key, val in a.items():
            if isinstance(val, dict) and isinstance(b.get(key), dict):
                walk(val, b[key], f"{prefix}{key}.")
            elif b.get(key, object()) != val:
                out[prefix + key] = val

    walk(value.model_dump(mode="json"), base, "")
    return out


def default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except Exception:  # a factory that needs its arguments: say so rather than fail
            return "*computed*"
        if isinstance(value, BaseModel):
            diff = _changed(type(value), value)
            if not diff:
                return f"defaults of `{type(value).__name__}`"
            return "; ".join(f"`{k}: {json.dumps(v)}`" for k, v in diff.items())
        return _value(value)
    if info.default is PydanticUndefined:
        return "**required**"
    return _value(info.default)


_BOUNDS = (
    ("gt", ">"),
    ("ge", "≥"),
    ("lt", "<"),
    ("le", "≤"),
    ("multiple_of", "multiple of"),
    ("min_length", "length ≥"),
    ("max_length", "length ≤"),
    ("pattern", "matches"),
)


def constraints_text(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        found = False
        for attr, word in _BOUNDS:
            val = getattr(meta, attr, None)
            if val is not None:
                parts.append(f"{word} `{val}`" if attr == "pattern" else f"{word} {_number(val)}")
                found = True
        if not found:
            text = str(meta)
            if text and not text.startswith("<"):
                parts.append(f"`{text}`")
    return ", ".join(parts)


def _number(v: Any) -> str:
    if isinstance(v, float) and (abs(v) >= 1e5 or 0 < abs(v) < 1e-3):
        return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), f"{v:g}")
    if isinstance(v, int) and abs(v) >= 10_000:
        return f"{v:_}"
    return str(v)


def _cell(text: str) -> str:
    """One table cell: one line, a ``|`` outside code spans escaped (inside them it is literal)."""
    parts = " ".join(str(text).split()).split("`")
    return "`".join(re.sub(r"(?<!\\)\|", r"\\|", p) if i % 2 == 0 else p for i, p in enumerate(parts))


# --------------------------------------------------------------------------- the table


def table(model: type[BaseModel], page: str = "", level: int = 3) -> str:
    """Markdown for one model: heading, docstring, field table, checks across fields."""
    intro, attrs = _sections(model)
    lines = [f"{'#' * level} `{model.__name__}` {{ #{anchor(model)} }}", ""]
    lines.append(f"<small>`{model.__module__}.{model.__qualname__}`</small>")
    lines.append("")
    if intro:
        lines += [intro, ""]
    lines += ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        key = info.alias or name
        description = info.description or attrs.get(name, "")
        if not description and _is_model(info.annotation):
            description = _sections(info.annotation)[0].split("\n\n")[0]
        cells = (
            f"`{key}`",
            type_text(info.annotation, page),
            default_text(info),
            constraints_text(info),
            _rst_to_md(description),
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    checks = [
        _rst_to_md(inspect.cleandoc(d.func.__doc__))
        for d in model.__pydantic_decorators__.model_validators.values()
        if getattr(d.func, "__doc__", None)
    ]
    checks += [
        _rst_to_md(inspect.cleandoc(d.func.__doc__))
        for d in model.__pydantic_decorators__.field_validators.values()
        if getattr(d.func, "__doc__", None)
    ]
    if checks:
        lines += ["", "Checks when it is built:", ""] + [f"- {' '.join(c.split())}" for c in checks]
    return "\n".join(lines) + "\n"


def render(markdown: str, page: str = "") -> str:
    """``markdown`` with every marker replaced by its model's table, its heading one level
    below the last heading before the marker."""

    def one(m: re.Match) -> str:
        text = re.sub(r"^```.*?^```", "", markdown[: m.start()], flags=re.MULTILINE | re.DOTALL)
        before = re.findall(r"^(#{1,5}) ", text, re.MULTILINE)
        level = len(before[-1]) + 1 if before else 2
        return table(load(m.group(1), m.group(2)), page, level)

    return MARKER.sub(one, markdown)


# --------------------------------------------------------------------------- mkdocs events


def on_config(config, **kwargs):
    """Import the models of the tree being built (the folder of mkdocs.yml), not an installed copy."""
    root = str(Path(config.config_file_path).resolve().parent)
    if sys.path[0] != root:
        sys.path.insert(0, root)
    return config


def on_files(files, config, **kwargs):
    """Where each documented model's table is, so that tables on other pages can link to it."""
    _WHERE.clear()
    for f in files:
        if not f.src_uri.endswith(".md"):
            continue
        text = Path(f.abs_src_path).read_text(encoding="utf-8")
        for m in MARKER.finditer(text):
            model = load(m.group(1), m.group(2))
            _WHERE.setdefault(model, (f.src_uri, anchor(model)))
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    return render(markdown, page.file.src_uri)
