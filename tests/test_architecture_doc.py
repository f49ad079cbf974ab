"""docs/architecture.md's recipes (adding a rung, a backend, a report) checked against the
code: every file, module, class, function, field and name they mention in code quotes must
exist, so the recipes cannot drift from what the code does."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
SECTIONS = ("Adding a rung", "Adding a backend", "Adding a benchmark report")


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 3)
    return text[start:] if end == -1 else text[start:end]


def _roots() -> list[Any]:
    """Where a name in the recipes may live (modules, classes with their fields)."""
    from tilegemm.backends.base import Backend, Target
    from tilegemm.backends.opencl_program import OpenCLProgram
    from tilegemm.bench.reports import PlanContext, Report
    from tilegemm.bench.sweeps import Case
    from tilegemm.registry import BackendLine, KernelSpec

    modules = ("tilegemm", "tilegemm.bench", "tilegemm.backends", "tilegemm.backends.base",
               "tilegemm.kernels.cuda._jit",
               "tilegemm.registry", "tilegemm.bench.report", "tilegemm.bench.reports",
               "tilegemm.bench.sweeps", "tilegemm.kernels.cudac",
               "tilegemm.backends.opencl_program")
    return [*map(importlib.import_module, modules), Backend, Target, KernelSpec, Report,
            PlanContext, Case, BackendLine, OpenCLProgram]


def _has(root: Any, dotted: str) -> bool:
    obj = root
    parts = dotted.split(".")
    if getattr(root, "__name__", None) == parts[0]:  # named from the module itself down
        parts = parts[1:]
    for part in parts:
        if part == "ctx":
            from tilegemm.bench.reports import PlanContext

            obj = PlanContext
            continue
        fields = ({f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj)
                  else set())
        if part in fields:
            obj = None  # a field: nothing below it to check
            continue
        if obj is None:
            return True
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
        except (AttributeError, ImportError):
            return False
    return True


def _names_known() -> set[str]:
    import tilegemm
    from tilegemm.bench.reports import all_reports
    from tilegemm.registry import BACKENDS, all_specs

    commands = {p.stem for p in (ROOT / "src/tilegemm/commands").glob("[a-z]*.py")}
    keywords = set(inspect.signature(tilegemm.gemm).parameters)  # kernel="auto", device=...
    rungs = {s.name for s in all_specs()}
    # the OpenCL prelude's macros, which a rung's kernel file uses
    prelude = ROOT / "src/tilegemm/kernels/opencl/_prelude.cl"
    macros = set(re.findall(r"#define\s+(\w+)", prelude.read_text()))
    return set(BACKENDS) | set(all_reports()) | commands | keywords | rungs | macros


def _path_exists(token: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", token.removeprefix("python ")).replace("kNN", "k[0-9][0-9]")
    if (ROOT / pattern).exists():
        return True
    if "/" not in pattern:  # a file name: anywhere in the package
        return any((ROOT / "src" / "tilegemm").rglob(pattern))
    return any(any(base.glob(pattern)) for base in (ROOT, ROOT / "src" / "tilegemm"))


def _missing(section: str) -> list[str]:
    missing = []
    roots = _roots()
    for token in sorted(set(re.findall(r"`([^`]+)`", _section(section)))):
        if token.startswith("*"):  # a file pattern
            continue
        if "-" in token and not token.startswith("-"):  # a dependency: declared
            if f'"{token}' not in (ROOT / "pyproject.toml").read_text():
                missing.append(token)
            continue
        if "/" in token or token.endswith((".py", ".toml", ".md")):
            if not _path_exists(token):
                missing.append(token)
            continue
        if token.startswith("-") or token.startswith("tilegemm "):  # a CLI option or command
            word = token.split()[-1].lstrip("-")
            if word.split("=")[0] not in _names_known() and token.startswith("tilegemm "):
                missing.append(token)
            continue
        names = [token.split(" = ")[1]] if " = " in token else [token]
        for name in names:
            name = re.split(r"[(=\[ ]", name)[0].strip()
            if not name or name.startswith("<") or name in _names_known():
                continue
            if name in ("SPEC", "BACKEND", "REPORT"):  # what a module defines
                continue
            if not any(_has(r, name) for r in roots):
                missing.append(token)
    return missing


@pytest.mark.parametrize("section", SECTIONS)
def test_recipe_names_only_what_exists(section: str) -> None:
    assert _missing(section) == [], f"docs/architecture.md, {section}: not in the code"


def test_shipped_examples_follow_the_recipes() -> None:
    """Each recipe's own example is built the way it says."""
    from tilegemm.bench.reports import Report, all_reports
    from tilegemm.registry import BACKENDS, all_specs

    assert all(isinstance(r, Report) for r in all_reports().values())
    assert {p.stem for p in (ROOT / "src/tilegemm/bench/reports").glob("[a-z]*.py")} == set(
        all_reports())
    assert "cudac" in BACKENDS and (ROOT / "src/tilegemm/backends/cudac.py").exists()
    assert any(s.backend == "cudac" for s in all_specs())
