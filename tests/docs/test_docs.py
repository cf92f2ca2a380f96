"""The README front door and the documentation site's generated configuration tables."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    spec = importlib.util.spec_from_file_location("config_tables", ROOT / "docs" / "hooks" / "config_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_door_of_at_most_12000_characters():
    assert len((ROOT / "README.md").read_text(encoding="utf-8")) <= 12_000


def test_the_readme_keeps_the_two_set_up_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo    # the main job: a DAPO training run on CPU" in text
    assert "make test    # the test suite (real Redis, Ray, Ray Serve, vLLM, Trinity-RFT); CI runs the same (.ci/run)" in text


def test_every_relative_link_of_the_readme_names_a_file_that_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)]+)\)", text) if "://" not in t]
    assert targets, "the README links into the docs"
    assert [t for t in targets if not (ROOT / t).exists()] == []


class _Small(BaseModel):
    """A model for the table test.

    Attributes:
        mode: how it goes, from the docstring.
    """

    count: int = Field(3, ge=1, le=20_000, description="How many, a | b.")
    ratio: float | None = Field(None, gt=0.0, description="A share.")
    mode: Literal["a", "b"] = "a"
    name: str = Field(min_length=2, description="Required.")


def test_a_model_becomes_a_table_with_type_default_constraints_and_description():
    table = _hook().table(_Small, level=2)
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert table.startswith("## `_Small` { #config-_small }")
    assert rows == [
        "| `count` | `int` | `3` | ≥ 1, ≤ 20_000 | How many, a \\| b. |",
        "| `ratio` | `float` \\| `null` | `null` | > 0.0 | A share. |",
        '| `mode` | `"a"` \\| `"b"` | `"a"` |  | how it goes, from the docstring. |',
        "| `name` | `str` | **required** | length ≥ 2 | Required. |",
    ]


def test_a_marker_naming_a_model_that_does_not_exist_fails_the_build():
    with pytest.raises(RuntimeError, match="orchestrator.core.policy:NoSuchPolicy"):
        _hook().render("<!-- config-table: orchestrator.core.policy:NoSuchPolicy -->\n")


def test_no_documentation_page_is_over_500_lines():
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert pages, "the docs folder has pages"
    assert [(str(p.relative_to(ROOT)), n) for p in pages if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500] == []


def test_the_readme_says_what_it_is_and_how_it_fits_before_the_set_up_and_the_set_up_before_the_results():
    headings = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## How it fits", "## Set-up on a fresh machine", "## Results"]


def test_the_api_pages_show_a_sphinx_role_as_its_code_span():
    spec = importlib.util.spec_from_file_location("rst_roles", ROOT / "docs" / "hooks" / "rst_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    html = "see :class:<code>~orchestrator.core.types.Group</code> and :meth:<code>plan_round</code>, not :x:<code>y</code>"
    assert module.strip_roles(html) == "see <code>Group</code> and <code>plan_round</code>, not :x:<code>y</code>"
