"""The benchmark scripts' results files: what they record, and what they refuse to write.

A run that measures nothing must not replace a machine's committed results with an empty
file; the JSON of ``tensor_core_errors.py`` and ``cpu_accuracy.py`` records the commit and
the machine like every other results file; ``--suffix`` joins the file name with a "-".

Scripts that write under ``<repository>/benchmarks/results/`` run here from a copy in
``tmp_path/benchmarks/`` (they find the repository from their own path), so a failing test
never touches the committed results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import script_json

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _env(**more: str) -> dict[str, str]:
    """This environment without the CUDA simulator (a run must find no CUDA device here)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return {**env, **more}


def _run(script: Path, *args: str, env: dict[str, str] | None = None,
         cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=120, env=env or _env(), cwd=cwd)


def _copy(tmp_path: Path, *names: str) -> Path:
    """``names`` (and ``cpu_blocked.py``, which they import) copied to
    ``tmp_path/benchmarks``: their results folder is ``tmp_path/benchmarks/results``."""
    where = tmp_path / "benchmarks"
    where.mkdir()
    for name in {*names, "cpu_blocked.py"}:
        shutil.copy(BENCH / name, where / name)
    return where


@pytest.fixture(scope="module")
def no_cuda() -> None:
    """Skip where CUDA is usable without the simulator (a GPU machine would measure)."""
    done = subprocess.run(
        [sys.executable, "-c", "from tilegemm.backends import get_backend; "
         "print(get_backend('cuda').status().usable)"],
        capture_output=True, text=True, timeout=120, env=_env())
    if done.stdout.strip() != "False":
        pytest.skip("CUDA is usable here: these runs would measure")


NOTHING = "nothing was measured"


def test_first_call_that_measures_nothing_saves_nothing(tmp_path, no_cuda):
    where = _copy(tmp_path, "first_call.py")
    done = _run(where / "first_call.py", "--backends", "cuda", "--runs", "1", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert NOTHING in done.stdout and "nothing was saved" in done.stdout
    assert not (where / "results").exists()


def test_first_call_unknown_backend_is_one_usage_error(tmp_path):
    where = _copy(tmp_path, "first_call.py")
    done = _run(where / "first_call.py", "--backends", "cude", cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "invalid choice: 'cude'" in done.stderr
    assert not (where / "results").exists()


def test_small_calls_that_measure_nothing_save_nothing(tmp_path, no_cuda):
    out = tmp_path / "small-calls.json"
    done = _run(BENCH / "small_calls.py", "--backends", "cuda", "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert NOTHING in done.stdout
    assert not out.exists()


def test_dask_matmul_that_measures_nothing_saves_nothing(tmp_path):
    pytest.importorskip("distributed")
    where = _copy(tmp_path, "dask_matmul.py")
    done = _run(where / "dask_matmul.py", "--skip-speed", "--skip-memory", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert NOTHING in done.stdout
    assert not (where / "results").exists()


def test_dask_matmul_method_is_the_prose_not_the_usage_lines():
    pytest.importorskip("distributed")
    method = script_json(
        "import json, sys; sys.path.insert(0, sys.argv[1]); import dask_matmul; "
        "print(json.dumps(dask_matmul.method()))", str(BENCH), timeout=120)
    assert method.startswith("Speed:"), method[:200]
    assert "Memory:" in method
    assert "python benchmarks/" not in method and "Usage" not in method


def test_tensor_core_errors_json_records_commit_and_backend(tmp_path):
    out = tmp_path / "errors.json"
    done = _run(BENCH / "tensor_core_errors.py", "--k", "16", "--mn", "16", "--json", str(out),
                env=_env(NUMBA_ENABLE_CUDASIM="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["git_commit"]
    assert doc["backend_info"]["simulated"] is True
    assert doc["backend_info"]["device"]
    assert doc["rows"][0]["k"] == 16 and doc["versions"]["numpy"]


# cpu_accuracy.py's main with NumPy as the only contender: the kernels' compiles (~15 s on
# a fresh kernel cache) are not what is tested
ACCURACY_NUMPY_ONLY = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import cpu_accuracy
cpu_accuracy.contenders = lambda: {"numpy": np.matmul}
sys.argv = ["cpu_accuracy.py", *sys.argv[2:]]
cpu_accuracy.main()
"""


def test_cpu_accuracy_json_records_the_machine(tmp_path):
    out = tmp_path / "accuracy.json"
    done = subprocess.run([sys.executable, "-c", ACCURACY_NUMPY_ONLY, str(BENCH), "--log2k",
                           "4", "--seeds", "1", "--json", str(out)], capture_output=True,
                          text=True, timeout=120, env=_env(), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    for key in ("cpu_model", "isa", "git_commit", "numpy_version", "numba_version",
                "numpy_blas", "cores"):
        assert doc.get(key) not in (None, ""), key
    assert doc["seeds"] == 1 and {r["k"] for r in doc["rows"]} == {16}


# Each script's parsed --suffix, read where its parser returns (nothing is measured).
PARSED_SUFFIX = """
import argparse, json, runpy, sys
real = argparse.ArgumentParser.parse_args
def parse(self, args=None, namespace=None):
    print(json.dumps(real(self, args, namespace).suffix))
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parse
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script", ["cpu_auto.py", "cpu_int_tiles.py", "cpu_tiles.py",
                                    "cpu_shapes.py"])
def test_suffix_is_joined_with_a_dash(script):
    path = str(BENCH / script)
    assert script_json(PARSED_SUFFIX, path, "--suffix", "audit", timeout=120) == "-audit"
    assert script_json(PARSED_SUFFIX, path, "--suffix=-audit", timeout=120) == "-audit"
    assert script_json(PARSED_SUFFIX, path, timeout=120) == ""


def test_saved_results_name_joins_the_suffix_with_a_dash(tmp_path):
    where = _copy(tmp_path)
    path = Path(script_json(
        "import json, sys; sys.path.insert(0, sys.argv[1]); import cpu_blocked; "
        "print(json.dumps(str(cpu_blocked.save_results('cpu-tiles', {}, suffix='audit'))))",
        str(where), timeout=120))
    assert path.parent == where / "results"
    assert path.name.startswith("cpu-tiles-") and path.name.endswith("-audit.json")
    assert not path.name.endswith("--audit.json")


def test_cpu_int_tiles_refuses_tiles_that_do_not_fit():
    done = _run(BENCH / "cpu_int_tiles.py", "--sizes", "64", "--dtypes", "int64", "--tiles",
                "32x64", "--rounds", "1", "--no-save")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no tile given fits int64")
    assert "at most 192" in lines[0]  # the limit: MR*NR of an 8-byte type


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("step", ["--help", "nonsense"])
def test_gpu_run_unknown_step_makes_no_output_folder(tmp_path, step):
    out = tmp_path / "gpu-out"
    done = subprocess.run(["bash", str(BENCH / "gpu_run.sh"), step], capture_output=True,
                          text=True, timeout=60, env=_env(OUT=str(out)), cwd=ROOT)
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert not out.exists()


def test_parallel_region_records_each_layer_and_the_machine(tmp_path):
    """The region-cost script measures each threading layer in a process of its own and
    records what that process ran on, the machine beside it; a layer Numba cannot start
    here is named, not fatal (figures are not checked: timing is the script's business)."""
    out = tmp_path / "region.json"
    done = _run(BENCH / "parallel_region.py", "--layers", "default", "workqueue", "--threads",
                "2", "--work", "0", "1", "--rounds", "1", "--calls", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["cpu_model"] and doc["git_commit"] and "prange of 2 tasks" in doc["method"]
    by_asked = {layer["asked"]: layer for layer in doc["layers"]}
    assert set(by_asked) <= {"default", "workqueue"} and "default" in by_asked
    for asked, layer in by_asked.items():
        assert layer["layer"] in ("tbb", "omp", "workqueue") and layer["threads"] == 2
        assert asked == "default" or layer["layer"] == asked
        assert [row["work_us"] for row in layer["rows"]] == [0, 1]
        for row in layer["rows"]:
            assert set(row) >= {"us_1_thread", "us_2_threads", "speedup"}


def test_parallel_region_on_one_thread_saves_nothing(tmp_path):
    out = tmp_path / "region.json"
    done = _run(BENCH / "parallel_region.py", "--threads", "1", "--out", str(out))
    assert done.returncode == 2 and "nothing was measured" in done.stdout
    assert not out.exists()


def test_cpu_ab_times_two_trees_and_refuses_a_folder_without_the_rung():
    """benchmarks/cpu_ab.py against this same tree: both programs checked and timed, one
    line per product; a folder without the rung's template, or a shape that is not MxNxK,
    is a usage error (exit 2) before anything is built."""
    script = BENCH / "cpu_ab.py"
    env = _env(PYTHONPATH=str(ROOT / "src"))
    done = _run(script, str(ROOT), "--shapes", "17x70x40", "--dtypes", "float64",
                "--rounds", "1", "--pause", "0", env=env)
    assert done.returncode == 0, done.stderr
    line = [x for x in done.stdout.splitlines() if x.startswith("float64 17x70x40")]
    assert len(line) == 1 and "other/this" in line[0], done.stdout
    for args in (("/nonexistent", "--shapes", "8x8x8"), (str(ROOT), "--shapes", "8x8")):
        refused = _run(script, *args, env=env)
        assert refused.returncode == 2, (args, refused.stderr)
        assert "Traceback" not in refused.stderr
