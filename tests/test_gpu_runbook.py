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
    # `timeout` records the limits it is given, then runs the command as the real one would
    stub = stubs / "timeout"
    stub.write_text(f'#!/usr/bin/env bash\necho "timeout $1 $2 $3" >> {calls}\nshift 3\n'
                    '"$@"\n')
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
    limits = [int(c.split()[3]) for c in calls if c.startswith("timeout ")]
    assert limits[:2] == [200, 200]  # each part's own limit while the step has time
    assert all(c.startswith("timeout -k 5 ") for c in calls if c.startswith("timeout "))


def test_a_part_gets_no_more_than_what_is_left_of_the_step(tmp_path):
    out, calls = _run(tmp_path, "check", 100)
    limits = [int(c.split()[3]) for c in calls if c.startswith("timeout ")]
    # smoke asks for 200 s and the three side-by-side jobs for 420: all cut to <= 100 s
    assert len(limits) == 4 and all(20 <= t <= 100 for t in limits)
    assert {"smoke: exit 0", "memcheck: exit 0", "racecheck: exit 0",
            "gpu tests: exit 0"} <= set(out.splitlines())


def test_a_spent_step_skips_its_parts(tmp_path):
    out, calls = _run(tmp_path, "bench", 10)  # under the 20 s a part needs at least
    assert "bench: skipped" in out and "targets auto: skipped" in out
    assert not [c for c in calls if "perf_targets" in c or "cli bench" in c]


def test_small_step_times_the_cuda_backends_into_out(tmp_path):
    out, calls = _run(tmp_path, "small", 300)
    assert "small calls: exit 0" in out
    runs = [c for c in calls if c.startswith("benchmarks/")]
    assert runs == [f"benchmarks/small_calls.py --backends cuda cudac cpu --out "
                    f"{tmp_path / 'out' / 'small-calls-gpu.json'}"]
