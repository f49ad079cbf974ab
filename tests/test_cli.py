"""The tilegemm command: readable output, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tilegemm.cli import main


def test_kernels_lists_every_rung(capsys):
    import tilegemm

    assert main(["kernels", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {(k["backend"], k["name"]) for k in listed} == {
        (s.backend, s.name) for s in tilegemm.kernels()
    }
    # the defaults measured per kind of device, which the generic column did not show
    vectorized = next(k for k in listed if (k["backend"], k["name"]) == ("opencl", "vectorized"))
    assert vectorized["device_defaults"]["cpu"]["VW"] == 8
    assert main(["kernels"]) == 0
    assert "opencl vectorized on cpu devices: defaults BM=8" in capsys.readouterr().out


def test_kernels_says_why_a_type_leaves_no_rung(capsys):
    """``kernels --dtype bfloat16 --backend cpu`` printed an empty table: now a line that
    says which backends' rungs compute the type and that matmul takes it anyway."""
    assert main(["kernels", "--dtype", "bfloat16", "--backend", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "No cpu rung computes bfloat16 (the cuda rungs do)" in out
    assert "tilegemm run --dtype bfloat16" in out
    assert main(["kernels", "--dtype", "float64", "--backend", "cpu"]) == 0
    assert "No cpu rung" not in capsys.readouterr().out


def test_info_runs(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "numpy" in out


def test_run_verifies_and_reports(capsys):
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop",
                 "--m", "17", "--n", "9", "--k", "5", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "verified: yes" in out and "GFLOP/s" in out


def test_run_takes_the_sides_as_short_options(capsys):
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop",
                 "-m", "17", "-n", "9", "-k", "5", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "M=17 N=9 K=5" in out and "verified: yes" in out
    assert main(["run", "--backend", "cpu", "-m", "-1"]) == 2


def test_run_errors_are_one_line(capsys):
    assert main(["run", "--backend", "cpu", "--kernel", "nope", "--m", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilegemm: error:") and "choices" in err and err.count("\n") == 1
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop", "TILE=x"]) == 2
    assert main(["run", "--backend", "cpu", "--m", "-1"]) == 2


def test_entry_point_module_runs():
    r = subprocess.run([sys.executable, "-m", "tilegemm.cli", "--version"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.startswith("tilegemm ")


@pytest.mark.parametrize("argv", [["run", "--help"], ["kernels", "--help"]])
def test_help(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0


def test_kernels_markdown_comes_from_the_registry(capsys):
    import tilegemm

    assert main(["kernels", "--markdown"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == len(tilegemm.kernels())


@pytest.mark.parametrize("empty", [["--m", "0"], ["--k", "0"]])
def test_run_of_an_empty_product_reports_no_rate(empty, capsys):
    """It printed '0.00 GFLOP/s' for a product with nothing to compute."""
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop", "--m", "3", "--n", "3",
                 "--k", "3", *empty]) == 0
    out = capsys.readouterr().out
    assert "no work (an empty product)" in out and "GFLOP/s" not in out


def test_run_refuses_negative_repeat_and_reports_no_steady_time_for_zero(capsys):
    """--repeat -1 was accepted, and --repeat 0 printed the first call (compilation
    included) as the 'steady' time with a GFLOP/s figure."""
    base = ["run", "--backend", "cpu", "--kernel", "triple_loop", "--m", "3", "--n", "3",
            "--k", "3"]
    assert main([*base, "--repeat", "-1"]) == 2
    assert "--repeat must be >= 0" in capsys.readouterr().err
    assert main([*base, "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "verified: yes" in out and "GFLOP/s" not in out and "not measured" in out


def test_kernels_resources_without_a_rung_for_the_dtype_names_who_has_one(capsys):
    """'backend cudac has none: use --backend cuda or cudac' said cudac had no compiled
    rungs and sent the user back to it, when --dtype had left none."""
    assert main(["kernels", "--resources", "--backend", "cudac", "--dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert "no cudac rung computes float16; the cuda rungs that do: --backend cuda" in err


def test_kernels_resources_for_a_backend_without_cuda_rungs_is_an_error(capsys):
    """It printed an empty table: resources are compiled for CUDA rungs only."""
    assert main(["kernels", "--resources", "--backend", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA rungs" in err


def test_sizes_too_large_for_memory_are_one_line(capsys):
    """A learner asking for a huge product got NumPy's MemoryError as a traceback."""
    assert main(["run", "--backend", "cpu", "--m", "10000000", "--n", "10000000",
                 "--k", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilegemm: error:") and "allocate" in err and err.count("\n") == 1


@pytest.mark.cudasim
@pytest.mark.simulator
def test_run_on_the_simulator_uses_small_tiles(capsys):
    assert main(["run", "--backend", "cuda", "--kernel", "register2d", "--m", "9", "--n", "7",
                 "--k", "5", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "simulator parameters" in out and "verified: yes" in out
    # why these parameters: the simulator's, not the rung's defaults ("default", before)
    assert "chosen: simulator" in out and "chosen: default" not in out


def test_help_shows_defaults_and_no_markup(capsys):
    """run --help hid its defaults; descriptions showed reStructuredText ``marks``."""
    for argv in (["run", "--help"], ["bench", "--help"], ["tune", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "``" not in out
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 512)" in out and "(default: float32)" in out and "(default: 3)" in out


def test_tune_show_fits_80_columns(tmp_path, monkeypatch, capsys):
    from tilegemm.tune import cache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    cache.record(cache.Entry(
        backend="opencl", device="pthread-Intel(R) Xeon(R) Platinum 8480+ (pocl)",
        arch="cpu", dtype="float32", bucket=[1024, 1024, 1024], kernel="vectorized",
        params={"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "VW": 4}, seconds=0.01,
        gflops=123.4, shape=[1000, 1000, 1000, 0]))
    assert main(["tune", "--show"]) == 0
    out = capsys.readouterr().out
    assert "vectorized" in out and "123.4" in out
    assert max(len(line) for line in out.splitlines()[1:]) <= 80


def test_explain_help_shows_the_trace_defaults(capsys, monkeypatch):
    """The trace's options default to None (so that --sass can refuse them even at their
    defaults), and --help showed no default for --m, --gpu, --samples, --full-limit."""
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    out = capsys.readouterr().out
    for text in ("of the result (default: 32)", "contracted) dimension (default: 32)",
                 "roofline bound (default: h100)", "sampled (default: 2)",
                 "in full (default: 16)"):
        assert text in out, text


def test_tune_budget_zero_says_how_many_candidates_will_run(tmp_path, monkeypatch, capsys):
    """--budget 0 ("all") on the CPU is thousands of candidates, each built and timed: a
    run of many hours, started without a word."""
    import re

    from tilegemm.tune import strategies

    ran = []

    def first_only(backend, spec, prob, cands, **kwargs):  # noqa: ANN001, ANN003, ANN202
        ran.append(len(cands))
        return strategies.TuneResult(spec, prob, [strategies.Trial(dict(cands[0]), "ok",
                                                                   seconds=1e-3)])

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(strategies, "tune", first_only)
    assert main(["tune", "--backend", "cpu", "--kernel", "blocked", "--m", "64",
                 "--budget", "0", "--dry-run"]) == 0
    note = re.search(r"--budget 0 runs all (\d+) candidates of blocked", capsys.readouterr().out)
    assert note and int(note[1]) == max(ran) > 1000
    assert main(["tune", "--backend", "cpu", "--kernel", "blocked", "--m", "64",
                 "--budget", "3", "--dry-run"]) == 0
    assert "--budget 0 runs all" not in capsys.readouterr().out


def test_tune_show_says_each_entrys_precision(tmp_path, monkeypatch, capsys):
    """Two entries differing only in precision (TF32, 3xTF32) were listed as the same
    rung and parameters, with nothing to tell which calls each serves."""
    from tilegemm.tune import cache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    for precision, gflops in (("tf32", 300.0), ("3xtf32", 90.0), ("ieee", 50.0)):
        cache.record(cache.Entry(
            backend="cuda", device="NVIDIA H100 80GB HBM3", arch="sm_90", dtype="float32",
            bucket=[4096, 4096, 4096], kernel="wgmma" if precision != "ieee" else "pipelined",
            params={"BM": 128}, seconds=0.01, gflops=gflops, shape=[4096, 4096, 4096, 0],
            precision=precision))
    assert main(["tune", "--show"]) == 0
    out = capsys.readouterr().out
    assert "300.0 GFLOP/s at precision=tf32, measured" in out
    assert "90.0 GFLOP/s at precision=3xtf32, measured" in out
    assert "50.0 GFLOP/s, measured" in out


def test_tune_output_off_a_terminal_has_no_blank_lines(tmp_path, monkeypatch, capsys):
    """The progress bar left blank lines in logs and pipes."""
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    assert main(["tune", "--backend", "cpu", "--kernel", "triple_loop", "--m", "8", "--n", "8",
                 "--k", "8", "--budget", "1", "--repeat", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and all(line.strip() for line in lines), out


# --- refusals up front, in the command line's words --------------------------------------

@pytest.mark.parametrize("argv, message", [
    # a dtype the rung does not compute: refused before the tracer starts (was exit 3)
    (["explain", "naive", "--dtype", "float16", "--no-resources"], "does not compute float16"),
    (["explain", "vectorized", "--dtype", "int32", "--no-resources"], "does not compute int32"),
    # a result this machine cannot hold (was a child's traceback in one line, exit 3)
    (["explain", "naive", "--m", "10000000", "--n", "10000000", "--k", "1", "--no-resources"],
     "cannot allocate"),
    # options of --sass alone were accepted and ignored
    (["explain", "naive", "--hot-loop"], "--hot-loop applies only with --sass"),
    (["explain", "naive", "--arch", "sm_80", "--yardstick"],
     "--arch and --yardstick apply only with --sass"),
    (["explain", "naive", "--batch", "-1"], "--batch must be >= 0"),
    (["explain", "naive", "--full-limit", "-1"], "--full-limit must be >= 0"),
    (["explain", "naive", "--beta", "nan"], "--beta must be a finite number"),
    # what matmul refuses was traced (or failed inside the compiler, reported as a bug)
    (["explain", "naive", "--dtype", "int32", "--beta", "0.5"],
     "beta must be an integer for a int32 product, got 0.5"),
    # beyond the scalar: the tracer failed ("internal error"), or beta became inf and the
    # kernel was reported wrong
    (["explain", "naive", "--dtype", "int32", "--beta", "3e9"],
     "beta 3e+09 does not fit int32 (-2147483648..2147483647)"),
    (["explain", "naive", "--beta", "1e39"], "beta 1e+39 overflows float32"),
    (["explain", "mma", "--dtype", "float16", "--m", "16", "--n", "16", "--k", "16",
      "PASSES=3"], "PASSES=1"),
    (["explain", "vectorized", "--dtype", "float64", "BM=256", "BN=256", "BK=16", "TM=16",
      "TN=16"], "bytes of shared memory per block"),
    # two kernels (slices, then their sum): the trace counted the first slice only
    (["explain", "pipelined", "SPLIT_K=2"], "SPLIT_K=2 runs two"),
    # the machine-code count of such a tile failed in the compiler ("internal error")
    (["explain", "warptile", "--sass", "--dtype", "float64", "BK=32"],
     "65536 bytes of shared memory per block"),
    (["tune", "--backend", "cpu", "--m", "8", "--seed", "-1"], "--seed must be >= 0"),
    # -3 was refused as "must be >= 0", and then 0 as "must be >= 1"
    (["tune", "--backend", "cpu", "--m", "-3"], "--m must be >= 1 (a product to time), got -3"),
    (["tune", "--backend", "cpu", "--m", "8", "--k", "0"], "--k must be >= 1"),
    (["tune", "--backend", "cpu", "--m", "8", "--max-call-seconds", "nan"],
     "--max-call-seconds must be >= 0, got nan"),
    # float16 on the CPU is computed in float32, with float32's tuning: the error sent the
    # user to CUDA
    (["tune", "--backend", "cpu", "--m", "8", "--dtype", "float16"],
     "computed in float32 and use its tuning: pass --dtype float32"),
    (["tune", "--backend", "cpu", "--kernel", "blocked", "--m", "8", "--dtype", "float16"],
     "does not support float16; it supports float32, float64, int32, int64 (float16 products "
     "on cpu are computed in float32"),
    # ... and the trace's options with --sass, which counts code, not a problem's traffic
    (["explain", "naive", "--sass", "--m", "4096"], "--m applies only to the trace"),
    (["explain", "naive", "--sass", "--samples", "4", "--no-resources"],
     "--samples and --no-resources apply only to the trace"),
    # given at their default values they were accepted and ignored
    (["explain", "naive", "--sass", "--m", "32", "--gpu", "h100"],
     "--m and --gpu apply only to the trace"),
    # parameters with several rungs were ignored (and not even checked)
    (["explain", "register2d", "--sass", "--yardstick", "BM=64"],
     "KEY=VALUE parameters apply to one rung at a time"),
    (["explain", "register2d,vectorized", "--sass", "FOO=1"],
     "KEY=VALUE parameters apply to one rung at a time"),
    (["explain", "register2d", "--sass", "FOO=1"], "has no parameter(s) FOO"),
    (["explain", "register2d", "--sass", "BM=7"], "BM=7 is not allowed"),
    # a tensor-core rung beside FFMA rungs dropped them without a word
    (["explain", "register2d,mma", "--sass"], "cannot share a table with the FFMA rungs"),
    (["explain", "register2d", "--sass", "--dtype", "float16"], "tensor-core rungs (mma)"),
    (["explain", "all"], "several rungs at once only with --sass"),
])
def test_explain_refuses_before_tracing(argv, message, capsys, monkeypatch):
    from tilegemm.analysis import trace

    def no_tracer(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the tracer must not start")

    monkeypatch.setattr(trace, "trace_in_subprocess", no_tracer)
    monkeypatch.setattr(trace, "trace_rung", no_tracer)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_explain_names_no_backend_it_cannot_take(capsys):
    """The hint said "pass backend='cpu'", which explain refuses."""
    assert main(["explain", "blocked"]) == 2
    err = capsys.readouterr().err
    assert "rung of backend 'cpu'" in err and "explain analyses the cuda rungs" in err
    assert "backend=" not in err and "--backend cpu" not in err
    assert main(["explain", "blocked", "--sass"]) == 2
    assert "backend=" not in capsys.readouterr().err


def test_errors_name_flags_not_python_keywords(capsys):
    assert main(["run", "TILE=16", "--m", "10", "--n", "10", "--k", "10"]) == 2
    err = capsys.readouterr().err
    assert "--kernel" in err and "kernel=" not in err
    assert main(["run", "--backend", "cpu", "--kernel", "shared", "--m", "4"]) == 2
    err = capsys.readouterr().err
    assert "backend='" not in err, err
    # the hint recommends a backend only where one with that rung can run here
    from tilegemm.backends import get_backend

    if any(get_backend(b).status().usable for b in ("cuda", "opencl", "cudac")):
        assert "pass --backend " in err, err
    else:
        assert "none of them usable here" in err and "pass" not in err, err


def test_as_flags_translates_only_options_the_command_has():
    from tilegemm.cli import as_flags

    options = frozenset({"--kernel", "--backend"})
    assert (as_flags("pass backend='opencl' or kernel= (kernel='auto' chooses)", options)
            == "pass --backend opencl or --kernel (--kernel auto chooses)")
    assert as_flags("device= works with backend='cuda'", frozenset({"--backend"})) == \
        "device= works with --backend cuda"
    assert as_flags("TILE=16 needs BM=4", options) == "TILE=16 needs BM=4"


def test_a_parameter_given_twice_is_refused(capsys):
    """run TILE=16 TILE=8 ran TILE=8 silently."""
    assert main(["run", "--backend", "cpu", "--kernel", "blocked", "MR=8", "MR=4",
                 "--m", "4"]) == 2
    assert "MR is given twice" in capsys.readouterr().err


def test_no_subcommand_is_a_usage_error(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert "COMMAND" in captured.err and captured.out == ""


def test_python_dash_m_tilegemm_runs():
    r = subprocess.run([sys.executable, "-m", "tilegemm", "--version"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.startswith("tilegemm ")


def test_run_times_what_matmul_runs_for_a_named_rung(capsys, tmp_path, monkeypatch):
    """run --kernel blocked timed the rung's registry defaults while matmul(kernel="blocked")
    runs this machine's measured tile (and the line said 'chosen: database')."""
    import numpy as np

    import tilegemm

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    a = np.ones((16, 16), np.float32)
    planned = tilegemm.plan(a, a, kernel="blocked", backend="cpu")
    assert main(["run", "--backend", "cpu", "--kernel", "blocked", "--m", "16", "--n", "16",
                 "--k", "16", "--repeat", "0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("cpu:blocked " + " ".join(f"{k}={v}" for k, v in
                                                       planned.params.items()) + " float32")


def test_run_names_the_device_once(capsys, tmp_path, monkeypatch):
    """It printed 'chosen: database (device) (device cpu/x86_64/...)'."""
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))  # no tuned entry for the rung
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop", "--m", "3", "--n", "3",
                 "--k", "3", "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "  chosen: default\n" in out and "  device: " in out and "(device " not in out


def test_tune_refuses_show_with_clear_and_bad_repeat_up_front(tmp_path, monkeypatch, capsys):
    from tilegemm.tune import cache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    cache.record(cache.Entry(backend="cpu", device="d", arch="x86_64", dtype="float32",
                             bucket=[8, 8, 8], kernel="blocked", params={}, seconds=1.0,
                             gflops=1.0))
    assert main(["tune", "--show", "--clear"]) == 2  # it showed, and did not clear
    assert "give one of them" in capsys.readouterr().err and cache.cache_path().exists()
    assert main(["tune", "--backend", "cpu", "--repeat", "0", "--m", "8"]) == 2
    captured = capsys.readouterr()
    assert "--repeat must be >= 1" in captured.err and captured.out == ""


@pytest.fixture
def _fresh_opencl_status():  # noqa: ANN202
    """The OpenCL backend's probes are cached per process: start and end with fresh ones."""
    from tilegemm.backends import get_backend, opencl

    caches = (type(get_backend("opencl")).status, opencl.default_device_index)

    def clear() -> None:
        for cached in caches:  # the originals: a test may have replaced the names
            cached.cache_clear()

    clear()
    yield
    clear()


@pytest.mark.opencl
def test_info_marks_opencl_devices_that_cannot_compile(monkeypatch, capsys,
                                                       _fresh_opencl_status):
    """info listed a device that cannot compile like a usable one; with PYOPENCL_CTX naming
    it, the backend row said 'yes' and every OpenCL call then failed."""
    from tilegemm.backends import get_backend, opencl

    devices = opencl.all_devices()
    broken = devices[-1]
    why = "PoCL 3.0-rc2 (LLVM 14.0.6) cannot compile for it: a stand-in reason"
    real = opencl.build_problem
    monkeypatch.setattr(opencl, "build_problem",
                        lambda d: why if d.int_ptr == broken.int_ptr else real(d))
    monkeypatch.setenv("COLUMNS", "400")  # no cell wraps
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cannot compile here" in out and "no: PoCL 3.0-rc2 (LLVM 14.0.6) cannot" in out
    # The default device chosen (as PYOPENCL_CTX can) is the one that cannot compile.
    monkeypatch.setattr(opencl, "default_device_index", lambda: len(devices) - 1)
    type(get_backend("opencl")).status.cache_clear()
    status = get_backend("opencl").status()
    if len(devices) > 1:  # another device can run: usable with device=, not without
        assert status.usable and "a stand-in reason" in status.default_problem
    else:
        assert not status.usable
    assert "a stand-in reason" in status.reason
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("│ opencl"))
    assert "yes" not in row


def test_info_fits_80_columns(monkeypatch, capsys):
    """The OpenCL devices table cut every column to 3-4 characters at 80 columns."""
    from tilegemm.backends import opencl

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    try:
        names = [d.name.strip() for d in opencl.all_devices()]
    except Exception:  # no OpenCL here: nothing more to check
        names = []
    for name in names:
        assert name in out


def _cache_entries(tmp_path):  # noqa: ANN001, ANN202
    """Twelve entries: eleven CPU ones that look alike but for their key, one stale."""
    from tilegemm.compile_cache import CacheEntry

    found = []
    for i in range(11):
        path = tmp_path / f"blocked-float32-{i:02d}aa{i:016d}.py"
        path.write_text("x")
        found.append(CacheEntry(path.stem, {"kernel": "blocked", "dtype": "float32",
                                            "params": {"MR": 8}}, {"numba": "0.68"},
                                i != 3, 2_000_000, (path,)))
    found.append(CacheEntry("warptile-float32-ffee", {
        "kernel": "warptile", "backend": "cuda", "dtype": "float32", "params": {"BM": 128},
        "output": "PTX sm_80 sm_90"}, {}, True, 500_000, ()))
    return found


def test_cache_summarises_a_large_cache_and_lists_rows_on_request(tmp_path, monkeypatch, capsys):
    """cache printed ~1000 lines for a real cache, with rows that could not be told apart."""
    from tilegemm import compile_cache

    found = _cache_entries(tmp_path)
    monkeypatch.setattr(compile_cache, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(compile_cache, "entries", lambda: found)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "12 entries" in out and "1 not usable here" in out and "--verbose" in out
    row = next(line for line in out.splitlines() if "blocked" in line)
    assert [c.strip() for c in row.split("│")[1:7]] == ["cpu", "blocked", "float32", "11",
                                                        "10", "22.0 MB"], row
    assert "cuda" in out and "warptile (PTX sm_80 sm_90)" in out
    assert "MR=8" not in out  # no rows
    assert main(["cache", "--verbose"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "cpu blocked" in line]
    assert len(rows) == 11 and len({r.split("│")[1] for r in rows}) == 11  # ids tell apart
    assert all("MR=8" in r for r in rows)
    assert main(["cache", "--list"]) == 0 and "MR=8" in capsys.readouterr().out


def test_device_chooses_among_devices_and_is_refused_where_there_is_one(capsys):
    """run and tune had no --device: only PYOPENCL_CTX / CUDA_VISIBLE_DEVICES could choose."""
    assert main(["run", "--backend", "cpu", "--device", "0", "--m", "4"]) == 2
    err = capsys.readouterr().err
    assert "--device" in err and "--backend opencl" in err and "'opencl'" not in err
    from tilegemm.backends import get_backend
    from tilegemm.registry import BACKENDS

    choosers = [get_backend(n) for n in BACKENDS if get_backend(n).accepts_device]
    any_usable = any(be.status().usable for be in choosers)
    # auto: steered to a usable backend with devices (0), else refused (2)
    assert main(["run", "--device", "0", "--m", "4"]) == (0 if any_usable else 2)
    capsys.readouterr()
    assert main(["tune", "--backend", "cpu", "--device", "0", "--m", "8"]) == 2
    captured = capsys.readouterr()
    assert "--backend auto chose" not in captured.err and "no device choice" in captured.err


@pytest.mark.opencl
def test_run_on_an_opencl_device_by_index(capsys):
    from tilegemm.backends import opencl

    index = opencl.default_device_index()
    assert main(["run", "--backend", "opencl", "--device", str(index), "--kernel", "naive",
                 "--m", "5", "--n", "3", "--k", "2", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert f"  device: [{index}] {opencl.all_devices()[index].name.strip()}" in out
    assert main(["run", "--backend", "opencl", "--device", "99", "--m", "4"]) == 2
    assert "unknown OpenCL device 99" in capsys.readouterr().err


def test_kernels_dtype_lists_the_rungs_that_compute_it(capsys):
    """kernels --dtype did nothing without --resources and offered float32/float64 only."""
    import tilegemm

    assert main(["kernels", "--dtype", "int64", "--json"]) == 0
    listed = {(k["backend"], k["name"]) for k in json.loads(capsys.readouterr().out)}
    assert listed == {(s.backend, s.name) for s in tilegemm.kernels() if s.supports("int64")}
    assert ("cpu", "blocked") in listed and ("cuda", "vectorized") not in listed
    assert main(["kernels", "--dtype", "bfloat16", "--json"]) == 0
    assert {k["name"] for k in json.loads(capsys.readouterr().out)} >= {"mma"}


def test_batch_zero_means_one_plain_product_for_explain_as_for_run(monkeypatch):
    """explain refused --batch 0, which run and tune use (their default) for a 2-D product."""
    from tilegemm.analysis import report
    from tilegemm.errors import InvalidValueError

    seen = {}

    def explain(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.update(kwargs)
        raise InvalidValueError("stop here")

    monkeypatch.setattr(report, "explain", explain)
    assert main(["explain", "naive", "--batch", "0", "--no-resources"]) == 2
    assert seen["batch"] == 1
    assert main(["explain", "naive", "--no-resources"]) == 2 and seen["batch"] == 1


@pytest.mark.opencl
def test_run_device_steers_auto_as_matmul_does(capsys):
    """--device with --backend auto chose the CPU and refused; matmul(device=) runs on the
    backend auto would pick among those with devices."""
    import numpy as np

    from tilegemm.api import choose_backend
    from tilegemm.problem import describe

    a = np.ones((4, 4), np.float32)
    expected = choose_backend("auto", [describe(a, "a"), describe(a, "b")], 0).name
    assert main(["run", "--device", "0", "--m", "4", "--n", "4", "--k", "4",
                 "--repeat", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"{expected}:")


def test_tune_summary_fits_80_columns(tmp_path, monkeypatch, capsys):
    """The summary's ten columns were cut to 'vecto…', 'rejec…', 'TILE…' at 80 columns.
    The first candidate the tuner would try is reported as measured, without compiling it
    (a cold compile of a CPU tile is 20-30 s, and only the table is checked here)."""
    from tilegemm.tune import strategies

    def measured(backend, spec, prob, cands, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return strategies.TuneResult(spec, prob, [strategies.Trial(dict(c), "ok", 2.5e-6,
                                                                   [2.5e-6])
                                                  for c in cands[:1]])

    monkeypatch.setattr(strategies, "tune", measured)
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["tune", "--backend", "cpu", "--kernel", "blocked", "--m", "8", "--n", "8",
                 "--k", "8", "--budget", "1", "--repeat", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out, out
    assert "1: 1 ok" in out


def test_tune_that_ran_nothing_for_the_time_limit_fails(tmp_path, monkeypatch, capsys):
    """Every candidate predicted over --max-call-seconds: nothing measured, nothing written,
    and the exit status was 0, so a script went on as if the tuning had worked."""
    from tilegemm.tune import strategies

    def all_slow(backend, spec, prob, cands, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return strategies.TuneResult(spec, prob, [strategies.Trial(dict(c), "slow",
                                                                   predicted=0.5)
                                                  for c in cands[:1]])

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(strategies, "tune", all_slow)
    assert main(["tune", "--backend", "cpu", "--kernel", "blocked", "--m", "64",
                 "--budget", "1", "--max-call-seconds", "0.001"]) == 2
    captured = capsys.readouterr()
    assert "0 entries written" in captured.out
    assert "no candidate ran: each was predicted to take 0.5 s or more per call, over the " \
        "0.001 s limit; raise --max-call-seconds" in captured.err
    assert not (tmp_path / "tune.json").exists()


@pytest.mark.parametrize("argv, message", [
    # rows of rungs whose block sizes were not among --blocks vanished without a word
    (["bench", "--blocks", "7", "--reports", "sizes", "--backend", "cpu"],
     "--blocks 7: no cpu rung takes that block size"),
    # a header and no table, exit 0
    (["bench", "--reports", "rsweep", "--backend", "cpu"],
     "no cpu rung has an outputs-per-thread parameter (R)"),
    # a size that cannot be allocated was an error after the cases before it, whose
    # results were lost with it
    (["bench", "--reports", "ladder", "--backend", "cpu", "--ladder-sizes", "16,10000000"],
     "cannot allocate A of shape (10000000, 10000000) as float32 (372529.0 GiB) on this "
     "machine; choose smaller --ladder-sizes"),
    (["bench", "--reports", "compile", "--backend", "cpu", "--compile-size", "10000000"],
     "choose smaller --compile-size"),
    # options of reports not run changed nothing, without a word
    (["bench", "--reports", "ladder", "--backend", "cpu", "--sizes", "64"],
     "--sizes applies to the 'sizes' report, which --reports leaves out"),
    (["bench", "--reports", "ladder,sizes", "--backend", "cpu", "--r-size", "64"],
     "--r-size applies to the 'rsweep' report"),
])
def test_bench_refuses_reports_that_would_be_empty(argv, message, capsys, monkeypatch):
    from tilegemm.bench import sweeps

    def no_run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("nothing may run")

    monkeypatch.setattr(sweeps, "run_bench", no_run)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bench_from_json_refuses_options_of_a_new_run_and_filters_reports(tmp_path, capsys):
    """--from-json ignored --reports, --budget, --backend... silently."""
    saved = "benchmarks/results/nvidia-h100-80gb-hbm3-2026-11-23.json"
    from pathlib import Path

    path = Path(__file__).parents[1] / saved
    assert main(["bench", "--from-json", str(path), "--budget", "3"]) == 2
    assert "--budget would change nothing" in capsys.readouterr().err
    assert main(["bench", "--from-json", str(path), "--reports", "ladder", "--format",
                 "md"]) == 0
    out = capsys.readouterr().out
    assert "### Ladder" in out and "First call vs steady" not in out


@pytest.mark.cudasim
@pytest.mark.parametrize("precision", ["tf32", "3xtf32"])
def test_run_takes_a_precision_and_verifies_at_it(precision, capsys):
    """'run' had no --precision (its error told the user to pass precision=), and the
    timing harness verified a TF32 result at float32's tolerance (FAILED)."""
    assert main(["run", "--backend", "cuda", "--kernel", "mma", "--precision", precision,
                 "--m", "16", "--n", "16", "--k", "16", "--repeat", "0"]) == 0
    assert "verified: yes" in capsys.readouterr().out


def test_bench_output_extension_and_format_must_agree(capsys, monkeypatch):
    """--format json -o results.csv wrote JSON into a .csv file without a word."""
    from tilegemm.bench import sweeps

    monkeypatch.setattr(sweeps, "run_bench", lambda *a, **k: pytest.fail("nothing may run"))
    assert main(["bench", "--format", "json", "-o", "results.csv"]) == 2
    assert "names csv by its extension, but --format is json" in capsys.readouterr().err


@pytest.mark.parametrize(("action", "options", "named"), [
    ("--show", ["--m", "64"], "--m would change nothing: leave it out"),
    ("--clear", ["--dtype", "float64", "--dry-run"], "--dtype, --dry-run would change nothing"),
    ("--show", ["--backend", "cpu"], "--backend would"),
])
def test_tune_show_and_clear_refuse_search_options(tmp_path, monkeypatch, capsys, action,
                                                   options, named):
    """--show and --clear act on the whole cache: 'tune --show --m 64' listed every entry as
    if --m had not been given, and 'tune --clear --dry-run' deleted the cache."""
    from tilegemm.tune import cache

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    cache.record(cache.Entry(
        backend="cpu", device="cpu", arch="x86_64", dtype="float32", bucket=[64, 64, 64],
        kernel="blocked", params={"MR": 8}, seconds=0.01, gflops=1.0, shape=[64, 64, 64, 0]))
    assert main(["tune", action, *options]) == 2
    assert named in capsys.readouterr().err
    assert cache.cache_path().exists() and len(cache.load()) == 1  # nothing deleted
    assert main(["tune", action]) == 0  # alone, as before
