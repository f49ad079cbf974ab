"""The benchmark and tool scripts from the command line, on a machine without a GPU:
``--help`` prints usage and does nothing else, and the GPU scripts refuse in one line with
exit status 2 instead of a traceback (or of a run that fails every check alike)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tools").glob("*.py")])


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _tree_digest() -> str:
    """The README and every committed results file: what a script could overwrite."""
    files = [ROOT / "README.md", *sorted((ROOT / "benchmarks" / "results").rglob("*"))]
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_every_script_is_listed() -> None:
    assert len(SCRIPTS) >= 20 and ROOT / "tools" / "update_readme.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_help_prints_usage_and_does_nothing_else(script: Path) -> None:
    """``tools/update_readme.py --help`` rewrote the README, and ``gpu_smoke.py --help``
    started the smoke test: neither read its arguments."""
    before = _tree_digest()
    done = _run(script, "--help")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("usage:"), done.stdout[:300]
    assert _tree_digest() == before


def _gpu_or_torch_present() -> bool:
    from tilegemm.backends import get_backend

    return get_backend("cuda").status().usable


@pytest.mark.parametrize(("script", "args", "says"), [
    ("tensor_cores.py", ["--sizes", "256", "--no-triton"], "needs a real GPU"),
    ("ncu_rung.py", ["--kernel", "wgmma", "--dtype", "float32", "--precision", "tf32"],
     "needs a GPU"),
    ("gpu_sanitize.py", [], "needs a CUDA GPU"),
    ("gpu_smoke.py", [], "needs a real CUDA GPU"),
    ("operand_layouts.py", ["--sizes", "64"], "needs a real GPU"),
])
def test_gpu_scripts_refuse_in_one_line_without_a_gpu(script: str, args: list[str],
                                                      says: str) -> None:
    """tensor_cores.py and ncu_rung.py ended in a traceback where torch is missing;
    gpu_sanitize.py printed 52 failures, one per rung and shape, each the same driver
    error."""
    if _gpu_or_torch_present():
        pytest.skip("a GPU is here")
    done = _run(ROOT / "benchmarks" / script, *args)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert says in out and "Traceback" not in out and len(out.strip().splitlines()) <= 2, out


@pytest.mark.parametrize(("script", "args", "says"), [
    ("gpu_sanitize.py", ["--kernel", "wgmmma"], "no CUDA rung wgmmma"),
    ("tensor_cores.py", ["--params", "BK"], "'BK' is not KEY=VALUE"),
    ("ncu_rung.py", ["--params", "BK=x"], "'x' is not an integer"),
    ("perf_targets.py", ["--shapes", "10x2"], "'10x2' is not MxNxK"),
    ("cpu_tiles.py", ["--blocks", "MC=x"], "cache blocks are MC=, KC= or NC="),
    ("cpu_small_tiles.py", ["--narrow", "10x2"], "give N (a cube) or MxNxK"),
    ("cpu_small_tiles.py", ["--cubes", "0"], "cube edges and --batch must be positive"),
])
def test_bad_arguments_are_one_line(script: str, args: list[str], says: str) -> None:
    """A misspelt rung made gpu_sanitize.py run nothing and report "0 failed"; a
    malformed --params ended in a ValueError traceback."""
    done = _run(ROOT / "benchmarks" / script, *args)
    assert done.returncode == 2 and says in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
