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


def _run(tmp_path: Path, step: str, seconds: int,
         env_var: str | None = None) -> tuple[str, list[str]]:
    """Run ``step`` with stubs; ``env_var``: each stub call also records that variable's
    value as the command saw it (``VAR=value``, or ``VAR unset``)."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    seen = (f' {env_var}=${{{env_var}-unset}}' if env_var else "")
    for name in ("py", "nvidia-smi", "compute-sanitizer", "ncu"):
        stub = stubs / name
        stub.write_text(f'#!/usr/bin/env bash\necho "$*{seen}" >> {calls}\n')
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
    out, calls = _run(tmp_path, "check", 100, env_var="NVIDIA_TF32_OVERRIDE")
    # the smoke test checks cuBLAS's TF32 reference, which that variable would turn off
    smoke = [c for c in calls if c.startswith("benchmarks/gpu_smoke.py")]
    assert smoke == ["benchmarks/gpu_smoke.py NVIDIA_TF32_OVERRIDE=unset"]
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


def test_tensor_core_steps_leave_tf32_on_in_cublas(tmp_path):
    """NVIDIA_TF32_OVERRIDE=0 (set for the FP32 steps) turns TF32 off inside cuBLAS: the
    first tensor-core timing compared TF32 with SGEMM that way. The steps that compare
    with cuBLAS TF32 run without it; the FP32 ones keep it."""
    _, calls = _run(tmp_path, "tensor", 300, env_var="NVIDIA_TF32_OVERRIDE")
    runs = [c for c in calls if c.startswith("benchmarks/tensor_cores.py")]
    assert runs and all(c.endswith("NVIDIA_TF32_OVERRIDE=unset") for c in runs)
    (tmp_path / "calls.txt").unlink()
    _, calls = _run(tmp_path, "bench", 300, env_var="NVIDIA_TF32_OVERRIDE")
    runs = [c for c in calls if "perf_targets" in c or "cli bench" in c]
    assert runs and all(c.endswith("NVIDIA_TF32_OVERRIDE=0") for c in runs)


def test_visit_step_tests_times_then_profiles(tmp_path):
    """The short visit: every rung once (the smoke test), the tensor-core tests on the GPU,
    small calls on CUDA, FP32 auto near 1000³ (as it is, then with rung pipelined's edge
    tiles shifted), both rungs against cuBLAS (and wgmma's B copied K-major), the host's
    time per call and rungs 6-9 at their copy threshold, then one
    profiled launch of each (ncu, its kernel named by ncu_rung.py), and last rung mma with
    a 64x64 warp tile."""
    out, calls = _run(tmp_path, "visit", 400, env_var="NVIDIA_TF32_OVERRIDE")
    labels = [line.split(":")[0] for line in out.splitlines() if ": exit " in line]
    assert labels == ["smoke", "tensor-core tests", "small calls", "edge sizes",
                      "edge sizes, shifted", "tensor cores, wgmma 4096",
                      "tensor cores, mma 4096", "tensor cores, wgmma BCOPY=1 4096",
                      "tensor cores, mma RCOPY=1 4096", "host overhead", "operand layouts",
                      "ncu wgmma float32",
                      "ncu wgmma bfloat16", "ncu mma float32",
                      "tensor cores, mma WN=64 4096", "tensor cores, mma WN=64 RCOPY=1 4096"]
    assert any(c.endswith("--params WN=64,RCOPY=1 NVIDIA_TF32_OVERRIDE=unset") for c in calls)
    assert any("--kernel wgmma" in c and "--params BN=256,BCOPY=1" in c for c in calls)
    assert any(c.startswith("benchmarks/host_overhead.py") for c in calls)
    edges = [c for c in calls if c.startswith("benchmarks/perf_targets.py --auto")]
    assert len(edges) == 2 and "--params" not in edges[0]
    assert all("--queued 20" in c for c in edges)  # the GPU's time, not the host's
    assert "--params SHIFT_EDGES=1 --shapes 1000x1000x1000" in edges[1]
    assert all(c.endswith("NVIDIA_TF32_OVERRIDE=unset") for c in calls
               if not c.startswith("timeout "))
    profiled = [c for c in calls if c.startswith("--clock-control none")]
    assert len(profiled) == 3 and all("benchmarks/ncu_rung.py --kernel" in c for c in profiled)
    assert "--dtype bfloat16" in profiled[1] and "--precision" not in profiled[1]


def test_ncu_kernel_patterns_tell_the_rungs_apart():
    import re
    import sys

    def pattern(rung: str) -> str:
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ncu_rung.py"),
                               "--name", rung], capture_output=True, text=True,
                              check=True).stdout.strip()

    mma, wgmma = pattern("mma"), pattern("wgmma")
    assert re.search(mma, "mma_float32_kernel") and not re.search(mma, "wgmma_float32_kernel")
    assert re.search(wgmma, "wgmma_bfloat16_kernel") and not re.search(wgmma, "mma_float32_k")
    assert not re.search(mma, "sm90_xmma_gemm_f32f32_tf32f32")  # cuBLAS's own kernels
