"""Each part of the core and of the actor owns its state (no reaching a sibling's attributes).

The measure: for every class in `orchestrator/core` and `orchestrator/service`, the distinct
attribute names it reads through `self` that neither it nor one of its base classes in the
project assigns or defines. A mixin that reads a sibling's attribute counts one per name; a
part that receives its collaborators in its constructor counts none. Classes whose bases leave
the project (pydantic models, exceptions, Ray or FastAPI types) are skipped: their inherited
names cannot be seen from here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "orchestrator"
ROOMS = ("core", "service")
# Bases that add no attributes a class would read through `self`.
NEUTRAL_BASES = {"object", "Protocol", "Generic", "ABC"}
LIMIT = 15


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _classes() -> dict[str, ast.ClassDef]:
    """Every class under `orchestrator/`, by name (names are unique in the rooms measured)."""
    found: dict[str, ast.ClassDef] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, node)
    return found


def _own_names(cls: ast.ClassDef) -> set[str]:
    """Names a class defines (methods, class attributes) or assigns through `self`."""
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, (ast.Store, ast.Del))
        ):
            names.add(node.attr)
        # setattr(self, "name", value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(node.args[1].value)
    return names


def _reads(cls: ast.ClassDef) -> set[str]:
    """Names read through ``self`` (dunder names, which Python gives every object, left out)."""
    return {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Load)
        and not (node.attr.startswith("__") and node.attr.endswith("__"))
    }


def cross_part_reads() -> dict[str, set[str]]:
    """Per measured class (`room/module.py:Class`), the names it reads that it does not own."""
    classes = _classes()
    result: dict[str, set[str]] = {}
    for room in ROOMS:
        for path in sorted((ROOT / room).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(node, ast.ClassDef):
                    continue
                owned, todo, seen, external = set(), [node], set(), False
                while todo:
                    cls = todo.pop()
                    if cls.name in seen:
                        continue
                    seen.add(cls.name)
                    owned |= _own_names(cls)
                    for base in cls.bases:
                        name = _base_name(base)
                        if name in NEUTRAL_BASES:
                            continue
                        if name in classes:
                            todo.append(classes[name])
                        else:
                            external = True
                if external:
                    continue
                missing = _reads(node) - owned
                if missing:
                    result[f"{room}/{path.name}:{node.name}"] = missing
    return result


def test_parts_read_only_what_they_own() -> None:
    reads = cross_part_reads()
    total = sum(len(names) for names in reads.values())
    detail = "\n".join(f"{k}: {sorted(v)}" for k, v in sorted(reads.items()))
    assert total < LIMIT, f"{total} cross-part reads through self:\n{detail}"


if __name__ == "__main__":
    reads = cross_part_reads()
    for key, names in sorted(reads.items()):
        print(f"{len(names):3d} {key}: {sorted(names)}")
    print("total", sum(len(v) for v in reads.values()))
