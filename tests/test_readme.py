"""The README's generated blocks match their sources (run `make readme` to refresh)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("update_readme",
                                                  ROOT / "tools" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_ladder_table_matches_the_registry():
    tool = _tool()
    text = (ROOT / "README.md").read_text()
    assert tool.render(text) == text, "README.md is stale: run `make readme`"


def test_readme_states_the_two_commands_ci_runs():
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make demo" in text and "make test" in text
    assert "make test" in ci
