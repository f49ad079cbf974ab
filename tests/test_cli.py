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
    assert main(["kernels"]) == 0


def test_info_runs(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "numpy" in out


def test_run_verifies_and_reports(capsys):
    assert main(["run", "--backend", "cpu", "--kernel", "triple_loop",
                 "--m", "17", "--n", "9", "--k", "5", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "verified: yes" in out and "GFLOP/s" in out


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


def test_tune_output_off_a_terminal_has_no_blank_lines(tmp_path, monkeypatch, capsys):
    """The progress bar left blank lines in logs and pipes."""
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    assert main(["tune", "--backend", "cpu", "--kernel", "triple_loop", "--m", "8", "--n", "8",
                 "--k", "8", "--budget", "1", "--repeat", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and all(line.strip() for line in lines), out
