"""What ``tilegemm bench``/``demo`` show and refuse: the ladder times what ``kernel="auto"``
runs as well as each rung's defaults, and says which is which; damaged results files, plot
and output names it cannot write, and a dtype or precision no chosen backend computes are
refused up front with exit status 2 and one line. Nothing here is timed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

import tilegemm
from tilegemm.backends.base import Backend, BackendStatus, Prepared
from tilegemm.bench import report
from tilegemm.bench.reports.ladder import SOURCES_NOTE
from tilegemm.bench.results import Results
from tilegemm.bench.sweeps import Settings, plan, run_plan
from tilegemm.bench.timing import Measurement, Policy
from tilegemm.cli import main
from tilegemm.errors import InvalidValueError
from tilegemm.registry import KernelSpec, Param

LADDER = Settings.quick(reports=("ladder",), ladder_sizes=(64,),
                        policy=Policy(warmup=0, min_reps=1, max_reps=2, budget_s=0.01))


def _build(p, dtype):  # type: ignore[no-untyped-def]
    def program(A, B, C, alpha, beta):  # type: ignore[no-untyped-def]
        C[...] = alpha * np.matmul(A, B)
    return program


TILED = KernelSpec(name="tiled_fake", backend="cpu", rung=92, title="one parameter",
                   build=_build, params=(Param("TILE", 16, (8, 16, 32)),))


class _FakeCpu(Backend):
    """Correct results and fixed fake timings: nothing is compiled or waited for."""

    name = "cpu"

    def status(self) -> BackendStatus:
        return BackendStatus("cpu", True, "fake")

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise AssertionError

    def prepare(self, spec, params, prob, a3, b3, target=None) -> Prepared:  # type: ignore[no-untyped-def]
        out = np.matmul(a3, b3)
        return Prepared(lambda: None, lambda: out, lambda n: [1e-3] * n)


def _ladder_with_auto(monkeypatch: pytest.MonkeyPatch, auto_params: dict[str, int],
                      why: str) -> list[Measurement]:
    """The fake rung's ladder when kernel="auto" picks it with ``auto_params``."""
    import tilegemm.bench.sweeps as sweeps

    monkeypatch.setattr(sweeps, "auto_pick", lambda *a, **k: (TILED, auto_params, why))
    cases = plan(["cpu"], LADDER, specs_for=lambda backend: [TILED])
    be = _FakeCpu()
    state = run_plan([c for c in cases if c.spec is not None], LADDER,
                     backend_of=lambda name: be)
    return state.measurements


# --- the ladder shows what kernel="auto" runs ---------------------------------------------


def test_ladder_plans_the_rung_and_parameters_auto_runs_here() -> None:
    """The ladder timed the CPU rung at its registry tile (MR=16 NR=8) while matmul ran the
    shipped database's tile: the benchmark did not show what a user gets."""
    cases = plan(["cpu"], LADDER)
    auto = [c for c in cases if c.source.startswith("auto: ")]
    chosen = tilegemm.plan(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32),
                           backend="cpu")
    assert len(auto) == 1
    assert (auto[0].spec.name, dict(auto[0].params)) == (chosen.kernel, chosen.params)
    assert auto[0].source == f"auto: {chosen.source}"
    rungs = [c for c in cases if c.spec is not None and not c.source.startswith("auto")]
    assert rungs and all(c.source == "defaults" for c in rungs)


def test_auto_at_other_parameters_is_its_own_row(monkeypatch: pytest.MonkeyPatch) -> None:
    ms = _ladder_with_auto(monkeypatch, {"TILE": 8}, "database (device)")
    by_tile = {m.params["TILE"]: m.sources for m in ms}
    assert by_tile == {16: ["defaults"], 8: ["auto: database (device)"]}
    text = report.to_markdown(Results({}, ms), ["ladder"])
    row = next(line for line in text.splitlines() if "TILE=8" in line)
    assert "| auto: database (device) |" in row
    assert SOURCES_NOTE in text


def test_auto_at_the_defaults_is_measured_once_and_says_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ms = _ladder_with_auto(monkeypatch, {"TILE": 16}, "default")
    assert len(ms) == 1 and ms[0].sources == ["defaults", "auto: default"]
    text = report.to_markdown(Results({}, ms), ["ladder"])
    assert "| defaults, auto: default |" in text


def test_results_files_keep_where_parameters_came_from() -> None:
    m = Measurement(backend="cpu", kernel="blocked", m=8, n=8, k=8, params={"MR": 8},
                    samples=[1e-3], reports=["ladder"], sources=["auto: tuned"])
    again = Results.from_json(Results({}, [m]).to_json()).measurements[0]
    assert again.sources == ["auto: tuned"]
    assert "auto: tuned" in report.to_csv(Results({}, [m]))
    # A file written before sources were recorded: its ladder held the rungs' defaults.
    old = {k: v for k, v in m.to_dict().items() if k != "sources"}
    text = report.to_markdown(Results({}, [Measurement.from_dict(old)]), ["ladder"])
    assert "| defaults |" in text and SOURCES_NOTE not in text


# --- damaged results files ---------------------------------------------------------------


def _one_line_refusal(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tilegemm: error: ") and "\n" not in err, err
    return err


def test_from_json_refuses_a_binary_file(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "b.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    err = _one_line_refusal(["bench", "--from-json", str(png)], capsys)
    assert "not a tilegemm benchmark file" in err


def test_from_json_refuses_a_directory(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_refusal(["bench", "--from-json", str(tmp_path)], capsys)
    assert "is a directory, not a results file" in err


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["measurements"][0].pop("kernel"), "missing field(s) 'kernel'"),
    (lambda d: d["measurements"][0].update(m="64"), "field 'm'"),
    (lambda d: d["measurements"][0].update(samples=["x"]), "field 'samples'"),
    (lambda d: d["measurements"].__setitem__(0, 5), "must be an object"),
    (lambda d: d["meta"].update(settings=[1]), "'settings' must be an object"),
    (lambda d: d.update(measurements={}), "'measurements' a list"),
    # these rendered as "internal error: AttributeError ... (this is a bug)", exit 3
    (lambda d: d["meta"].update(rivals=["x"]), "'rivals' must be an object"),
    (lambda d: d["meta"].update(settings={"policy": [1, 2]}),
     "'settings.policy' must be an object"),
    (lambda d: d["meta"].update(host={"env": ["A=1"]}), "'host.env' must be an object"),
    (lambda d: d["meta"].update(backends={"cpu": "Xeon"}), "'backends.cpu' must be an object"),
    (lambda d: d["meta"].update(rivals={"cpu": "x"}), "'rivals.cpu' must be an object"),
    # an internal error (None * int), and an empty report with exit status 0
    (lambda d: d["measurements"][0].update(m=None), "field(s) 'm' are null"),
    (lambda d: d.pop("measurements"), "no 'measurements'"),
])
def test_from_json_refuses_a_damaged_file(change, expected: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                          capsys: pytest.CaptureFixture[str]) -> None:
    m = Measurement(backend="cpu", kernel="k", m=4, n=4, k=4, samples=[1e-3],
                    reports=["ladder"])
    data = json.loads(Results({"settings": {}}, [m]).to_json())
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    err = _one_line_refusal(["bench", "--from-json", str(path)], capsys)
    assert "damaged tilegemm benchmark file" in err and expected in err, err


# --- names checked before the run ----------------------------------------------------------


@pytest.fixture
def never_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import tilegemm.bench.sweeps as sweeps

    ran: list[int] = []
    monkeypatch.setattr(sweeps, "run_bench", lambda *a, **k: ran.append(1))
    return ran


@pytest.mark.parametrize("name", ["y.txt", "y"])
def test_plot_name_matplotlib_cannot_write_is_refused_before_running(
        name: str, tmp_path: Path, never_runs: list[int],
        capsys: pytest.CaptureFixture[str]) -> None:
    """It ran the whole benchmark, wrote the results, then failed in savefig as a bug."""
    err = _one_line_refusal(["bench", "--backend", "cpu", "--reports", "sizes", "--sizes", "8",
                             "--quiet", "--plot", str(tmp_path / name)], capsys)
    assert "--plot" in err and ".png" in err and ".svg" in err
    assert not never_runs and not list(tmp_path.iterdir())


def test_plot_formats_come_from_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from tilegemm.bench.plot import check_plot_path

    for ok in ("a.png", "a.SVG", "d/a.pdf"):
        check_plot_path(ok)
    with pytest.raises(InvalidValueError, match="'.txt' is not an image format"):
        check_plot_path("a.txt")
    # Without matplotlib nothing is checked (drawing then reports the missing package).
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    check_plot_path("a.txt")


def test_output_name_without_a_results_format_is_refused_before_running(
        tmp_path: Path, never_runs: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    """-o results.txt wrote JSON into a .txt file without a word."""
    err = _one_line_refusal(["bench", "--backend", "cpu", "--quiet", "-o",
                             str(tmp_path / "results.txt")], capsys)
    assert "'.txt' names no results format" in err and "--format" in err
    assert not never_runs


def test_output_format_from_format_or_extension(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    m = Measurement(backend="cpu", kernel="k", m=4, n=4, k=4, samples=[1e-3],
                    reports=["ladder"])
    saved = tmp_path / "r.json"
    saved.write_text(Results({}, [m]).to_json())
    txt = tmp_path / "r.txt"
    assert main(["bench", "--from-json", str(saved), "-q", "--format", "csv",
                 "-o", str(txt)]) == 0
    assert txt.read_text().startswith("reports,backend,kernel")
    md = tmp_path / "r.MD"
    assert main(["bench", "--from-json", str(saved), "-q", "-o", str(md)]) == 0
    assert md.read_text().startswith("<!-- generated by `tilegemm bench`")


@pytest.mark.parametrize(("option", "where", "expected"), [
    ("-o", "dir", "is a directory"),
    ("-o", "file/x.json", "is not a directory"),
    ("--save", "file", "exists and is not a directory"),
    ("--plot", "file/p.png", "is not a directory"),
    ("-o", "/proc/tilegemm-nope/x.json", "cannot write to /proc"),
])
def test_destinations_that_cannot_be_written_are_refused_before_running(
        option: str, where: str, expected: str, tmp_path: Path, never_runs: list[int],
        capsys: pytest.CaptureFixture[str]) -> None:
    """The whole benchmark ran, then writing its results failed and they were lost."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    target = where if where.startswith("/") else str(tmp_path / where)
    if where.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    err = _one_line_refusal(["bench", "--backend", "cpu", "--reports", "sizes", "--sizes", "8",
                             "--quiet", option, target], capsys)
    assert option in err and expected in err, err
    assert not never_runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]  # nothing created


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("--budget", "0", "--budget must be a finite number > 0"),  # was "budget must be > 0 and
    ("--warmup", "-1", "--warmup must be >= 0"),                 # warm-up >= 0"
    ("--max-call-seconds", "-1", "--max-call-seconds must be a finite number >= 0"),
    # infinity was accepted, then every rung and NumPy "FAILED" with an OverflowError
    ("--budget", "inf", "--budget must be a finite number > 0, got inf"),
    ("--max-call-seconds", "inf", "--max-call-seconds must be a finite number >= 0"),
    ("--budget", "nan", "--budget must be a finite number > 0, got nan"),
])
def test_timing_options_are_refused_in_the_command_lines_words(
        option: str, value: str, expected: str, tmp_path: Path, never_runs: list[int],
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_refusal(["bench", "--backend", "cpu", "-o", str(tmp_path / "r.json"),
                             option, value], capsys)
    assert expected in err and not never_runs


def test_quiet_without_a_destination_is_refused(never_runs: list[int],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """-q alone ran the whole benchmark, printed nothing and kept nothing."""
    err = _one_line_refusal(["bench", "--backend", "cpu", "--quiet"], capsys)
    assert "would be thrown away" in err and not never_runs


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_reports_choose_the_rows_of_csv_and_json_too(fmt: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """--from-json X --reports ladder --format csv (or json) still held every report's rows;
    only Markdown honoured --reports. The JSON is a results file of those reports alone."""
    both = Measurement(backend="cpu", kernel="a", m=4, n=4, k=4, samples=[1e-3],
                       reports=["ladder", "sizes"])
    other = Measurement(backend="cpu", kernel="b", m=8, n=8, k=8, samples=[1e-3],
                        reports=["sizes"])
    saved = tmp_path / "r.json"
    saved.write_text(Results({"settings": {"reports": ["ladder", "sizes"]}},
                             [both, other]).to_json())
    assert main(["bench", "--from-json", str(saved), "--reports", "ladder",
                 "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n")
    if fmt == "csv":
        rows = out.splitlines()[1:]
        assert len(rows) == 1 and rows[0].startswith("ladder,cpu,a,")
    else:
        again = Results.from_json(out)
        assert [(m.kernel, m.reports) for m in again.measurements] == [("a", ["ladder"])]
        assert again.meta["settings"]["reports"] == ["ladder"]


# --- a dtype or precision the chosen backends cannot run ---------------------------------


@pytest.mark.parametrize("extra", [["--dtype", "float16"], ["--dtype", "bfloat16"],
                                   ["--precision", "tf32"], ["--precision", "3xtf32"]])
def test_bench_refuses_what_no_cpu_rung_computes(extra: list[str], tmp_path: Path,
                                                 never_runs: list[int],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """It printed the header, ran nothing and exited 0 (with -o, an empty results file)."""
    out = tmp_path / "r.json"
    err = _one_line_refusal(["bench", "--backend", "cpu", "-o", str(out), *extra], capsys)
    assert "no cpu rung computes" in err and "backends with one: cuda" in err
    assert not never_runs and not out.exists()


def test_demo_refuses_it_too(never_runs: list[int],
                             capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_refusal(["demo", "--backend", "cpu", "--dtype", "float16"], capsys)
    assert "no cpu rung computes float16" in err and not never_runs


class _Usable:
    def __init__(self, name: str) -> None:
        self.name = name

    def status(self) -> BackendStatus:
        return BackendStatus(self.name, True, "fake")


def test_default_backends_without_a_rung_are_left_out_or_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Unnamed backends that cannot run the dtype are left out with a line; only when none
    is left is the request refused."""
    import importlib

    import tilegemm.bench.sweeps as sweeps
    import tilegemm.commands.bench as bench

    monkeypatch.setattr(bench, "BACKENDS", ("gpu_fake", "cpu"))
    monkeypatch.setattr(importlib.import_module("tilegemm.backends"), "get_backend", _Usable)
    monkeypatch.setattr(sweeps, "rungs_for",
                        lambda name, *a, **k: {TILED: None} if name == "gpu_fake" else {})
    args = argparse.Namespace(backends=None, include_simulated=False)
    settings = Settings.quick(dtype="float16")
    run, left = bench.choose_backends(args, settings)
    assert run == ["gpu_fake"] and left == ["cpu: no rung computes float16"]
    monkeypatch.setattr(sweeps, "rungs_for", lambda *a, **k: {})
    with pytest.raises(InvalidValueError, match="no gpu_fake or cpu rung computes float16; "
                                                "backends with one: none"):
        bench.choose_backends(args, settings)


def test_precision_for_a_16bit_dtype_reads_as_a_sentence() -> None:
    from tilegemm.commands.bench import add_arguments, settings_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(InvalidValueError) as info:
        settings_from(parser.parse_args(["--dtype", "float16", "--precision", "tf32"]))
    assert str(info.value) == ("--precision tf32 applies to --dtype float32 only, not float16 "
                               "(float16 runs on tensor cores in its one mode: leave "
                               "--precision at ieee)")
    with pytest.raises(InvalidValueError) as info:
        settings_from(parser.parse_args(["--dtype", "float64", "--precision", "3xtf32"]))
    assert str(info.value) == "--precision 3xtf32 applies to --dtype float32 only, not float64"


# --- noisy-timing notes ----------------------------------------------------------------------


def test_noisy_notes_name_the_size() -> None:
    """The note listed 'coalesced BLOCK=8 (188%), coalesced BLOCK=8 (11%)'."""
    loud = [Measurement(backend="opencl", kernel="coalesced", m=n, n=n, k=n,
                        params={"BLOCK": 8}, samples=[1.0, 1.0, 3.0, 9.0]) for n in (8, 64)]
    [note] = report.noise_notes(loud)
    assert "coalesced BLOCK=8 at 8³ (" in note and "coalesced BLOCK=8 at 64³ (" in note
