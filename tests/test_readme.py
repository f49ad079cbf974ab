"""The README's generated blocks match their sources (run `make readme` to refresh)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


def _use_blocks() -> list[str]:
    """The Python blocks under "## Use", in order."""
    text = (ROOT / "README.md").read_text()
    use = text[text.index("## Use"):text.index("\n## ", text.index("## Use") + 1)]
    return [part.split("```", 1)[0] for part in use.split("```python")[1:]]


def test_readme_usage_snippet_runs_as_pasted_without_a_gpu():
    """Its backend="cuda" line raised on every machine without a GPU, and its
    backend="opencl" line on every machine whose OpenCL cannot compile (PoCL's wheel on a
    Zen 5 CPU). The first Python block under "## Use" must run as written on any CPU-only
    machine; the OpenCL and CuPy blocks after it say what they need."""
    block = _use_blocks()[0]
    assert 'backend="cuda"' not in block and 'backend="opencl"' not in block
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    from tilegemm.reference import assert_close

    a, b = namespace["a"], namespace["b"]
    assert_close(namespace["c"], a, b)
    assert_close(namespace["c3"], a[None], b)
    assert_close(namespace["e"], a, b)  # gemm(a.T, trans_a=True) is a @ b again


@pytest.mark.opencl
def test_readme_opencl_snippet_runs_where_opencl_compiles():
    first, opencl = _use_blocks()[:2]
    assert 'backend="opencl"' in opencl
    namespace: dict = {}
    exec(compile(first, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    namespace["c"] = None
    exec(compile(opencl, "README.md", "exec"), namespace)  # noqa: S102
    from tilegemm.reference import assert_close

    assert_close(namespace["c"], namespace["a"], namespace["b"])
