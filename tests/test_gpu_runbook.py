"""The GPU runbook script (``benchmarks/gpu_run.sh``) without a GPU: its parts run in the
documented order, and a step whose time is spent skips its remaining parts, saying so,
instead of running past the lent machine's limit on one command. The Python, nvidia-smi
and compute-sanitizer it calls are stubs that record their arguments."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_run.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and timeout")


def _run(tmp_path: Path, step: str, seconds: int) -> tuple[str, list[str]]:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    for name in ("py", "nvidia-smi", "compute-sanitizer"):
        stub = stubs / name
        stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
           "PY": str(stubs / "py"), "OUT": str(tmp_path / "out"), "STEP_SECONDS": str(seconds)}
    done = subprocess.run(["bash", str(SCRIPT), step], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, calls.read_text().splitlines() if calls.exists() else []


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_tensor_step_answers_the_targets_first(tmp_path):
    out, calls = _run(tmp_path, "tensor", 300)
    labels = [line.split(":")[0] for line in out.splitlines() if ": exit " in line]
    assert labels[:3] == ["tensor cores, mma 4096", "tensor cores, wgmma 4096",
                          "tensor-core errors"]
    runs = [c for c in calls if c.startswith("benchmarks/")]
    assert runs[0].startswith("benchmarks/tensor_cores.py --sizes 4096 ")
    assert "--kernel wgmma" in runs[1]


def test_a_spent_step_skips_its_parts(tmp_path):
    out, calls = _run(tmp_path, "bench", 10)  # under the 20 s a part needs at least
    assert "bench: skipped" in out and "targets auto: skipped" in out
    assert not [c for c in calls if "perf_targets" in c or "cli bench" in c]
