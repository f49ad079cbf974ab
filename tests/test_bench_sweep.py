"""Benchmark sweeps end to end on the CPU (and PoCL when the OpenCL backend is usable):
plans come from the registry, broken kernels show FAILED, files parse, the plot is a PNG.
No speed is asserted anywhere."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import host_tile
from tilegemm import registry
from tilegemm.backends import get_backend
from tilegemm.backends.base import Backend, BackendStatus, Prepared
from tilegemm.bench import report
from tilegemm.bench.reports.sizes import block_param
from tilegemm.bench.results import Results
from tilegemm.bench.sweeps import (
    Case,
    RunState,
    Settings,
    plan,
    run_bench,
    run_plan,
)
from tilegemm.bench.timing import FAILED, OK, SKIPPED, Measurement, Policy
from tilegemm.cli import main
from tilegemm.registry import Constraint, KernelSpec, Param, changed

TINY = Settings.quick(sizes=(8, 16), ladder_sizes=(16,), compile_size=16, r_size=16,
                      policy=Policy(warmup=1, min_reps=2, max_reps=4, budget_s=0.01))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# Fake CPU rungs with the CPU program convention program(A3, B3, C3, alpha, beta).
def _build_broken(p, dtype):  # type: ignore[no-untyped-def]
    def program(A, B, C, alpha, beta):  # type: ignore[no-untyped-def]
        C[:, :, :-1] = alpha * np.matmul(A, B)[:, :, :-1]  # never writes the last column
    return program


def _build_raising(p, dtype):  # type: ignore[no-untyped-def]
    def program(A, B, C, alpha, beta):  # type: ignore[no-untyped-def]
        raise IndexError("index 17 is out of bounds for axis 1 with size 16")
    return program


def _build_tiled(p, dtype):  # type: ignore[no-untyped-def]
    def program(A, B, C, alpha, beta):  # type: ignore[no-untyped-def]
        C[...] = alpha * np.matmul(A, B)
    return program


BROKEN = KernelSpec(name="broken_fake", backend="cpu", rung=90, title="skips the last column",
                    build=_build_broken)
RAISING = KernelSpec(name="raising_fake", backend="cpu", rung=91, title="raises",
                     build=_build_raising)
TILED = KernelSpec(name="tiled_fake", backend="cpu", rung=92, title="has TILE and R",
                   build=_build_tiled,
                   params=(Param("TILE", 16, (8, 16, 32)), Param("R", 4, (1, 2, 4, 8, 16, 32))),
                   constraints=(Constraint("R <= TILE", lambda p: p["R"] <= p["TILE"]),))


def _with_fakes(backend: str) -> list[KernelSpec]:
    real = list(registry.specs_for(backend))
    return real + [BROKEN, RAISING, TILED] if backend == "cpu" else real


@pytest.fixture(scope="module", autouse=True)
def _own_tile() -> Any:
    """The CPU blocked rung with this machine's float32 tile as its default MR x NR, in
    every test here: the reports that run a rung at its defaults then share its compiled
    code with the other tests, instead of compiling the registry's tile for themselves
    (25 s on 2 vCPUs, once per test session)."""
    tile = host_tile("float32")
    spec = registry.get("blocked", "cpu")
    blocked = replace(spec, params=changed(changed(spec.params, "MR", default=tile["MR"]),
                                           "NR", default=tile["NR"]))
    original = registry._specs_of
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_specs_of", lambda backend: tuple(
            blocked if s.name == "blocked" else s for s in original(backend)))
        yield


@pytest.fixture(scope="module")
def cpu_results(_own_tile: Any) -> Results:
    """A tiny real CPU run of every report with the fakes added as registered rungs (so
    tilegemm.matmul, which the harness uses without Backend.prepare, finds them by name)."""
    with pytest.MonkeyPatch.context() as mp:
        _register(mp)
        return run_bench(["cpu"], TINY)


def _register(mp: pytest.MonkeyPatch) -> None:
    original = registry._specs_of
    fakes = (BROKEN, RAISING, TILED)
    mp.setattr(registry, "_specs_of",
               lambda backend: original(backend) + tuple(f for f in fakes if f.backend == backend))


def test_plan_reads_block_and_r_parameters_from_the_registry() -> None:
    assert block_param(TILED) == "TILE" and block_param(BROKEN) is None
    cases = plan(["cpu"], TINY, specs_for=_with_fakes)
    sizes = [c for c in cases if c.report == "sizes" and c.spec is TILED]
    assert sorted((c.m, dict(c.params)["TILE"]) for c in sizes) == [
        (8, 8), (8, 16), (8, 32), (16, 8), (16, 16), (16, 32)]
    rs = [dict(c.params)["R"] for c in cases if c.report == "rsweep" and c.spec is TILED]
    assert rs == [1, 2, 4, 8, 16, 32]
    assert [c.report for c in cases[:1]] == ["compile"]  # cold first calls come first
    ladder = {c.spec.name for c in cases if c.report == "ladder" and c.spec}
    assert {s.name for s in registry.specs_for("cpu")} <= ladder
    assert any(c.report == "ladder" and c.spec is None for c in cases)  # the vendor


def test_a_report_is_one_module_declaring_cases_and_tables(
        cpu_results: Results, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shipped report is found by discovery, and a new one (here added to the
    discovered set, as a new module would be) joins plans, tables and rendering alone."""
    from tilegemm.bench.report import Table
    from tilegemm.bench.reports import Report, all_reports
    from tilegemm.bench.sweeps import REPORTS

    assert REPORTS == ("compile", "sizes", "rsweep", "ladder")  # table order, ladder last
    spec = registry.specs_for("cpu")[0]

    def cases(ctx):  # noqa: ANN001, ANN202
        return [ctx.case("tiny", be, 8, spec) for be in ctx.backends]

    def tables(results: Results) -> list[Table]:
        n = len(results.for_report("tiny", "cpu"))
        return [Table("Tiny report", ["cases"], [[str(n)]])]

    monkeypatch.setitem(all_reports(), "tiny", Report("tiny", 50, cases, tables))
    [case] = plan(["cpu"], Settings.quick(reports=("tiny",)))
    assert (case.report, case.spec, case.m) == ("tiny", spec, 8)
    assert "### Tiny report" in report.to_markdown(cpu_results, ["tiny", "ladder"])
    assert "### Tiny report" not in report.to_markdown(cpu_results, ["ladder"])


def test_identical_cases_are_measured_once(cpu_results: Results) -> None:
    keys = [(m.backend, m.kernel, tuple(m.params.items()), m.m, m.vendor)
            for m in cpu_results.measurements]
    assert len(keys) == len(set(keys))
    shared = [m for m in cpu_results.measurements if "ladder" in m.reports and
              "sizes" in m.reports]
    assert shared, "ladder at 16³ and the size table at 16 share their cases"


def test_broken_and_raising_kernels_are_failed_with_reasons(cpu_results: Results) -> None:
    broken = [m for m in cpu_results.measurements if m.kernel == "broken_fake"]
    raising = [m for m in cpu_results.measurements if m.kernel == "raising_fake"]
    assert broken and raising
    assert all(m.status == FAILED and m.gflops is None and not m.samples for m in broken)
    assert all("wrong result" in m.reason for m in broken)
    assert all("IndexError" in m.reason and "out of bounds" in m.reason for m in raising)
    assert {m.status for m in cpu_results.failed} == {FAILED}


def test_real_rungs_and_numpy_verify_and_have_samples(cpu_results: Results) -> None:
    real = {s.name for s in registry.specs_for("cpu")}
    ok = [m for m in cpu_results.measurements if m.kernel in real or m.vendor]
    assert ok and all(m.status == OK and m.samples and m.first_s for m in ok)
    assert any(m.vendor and m.kernel.startswith("NumPy") for m in ok)
    # R > TILE violates the fake's constraint: listed as not run, with the constraint text.
    bad_r = [m for m in cpu_results.measurements if m.kernel == "tiled_fake" and
             m.params["R"] > m.params["TILE"]]
    assert bad_r and all(m.status == SKIPPED and "R <= TILE" in m.reason for m in bad_r)


def test_json_has_metadata_and_raw_samples(cpu_results: Results, tmp_path: Path) -> None:
    data = json.loads(cpu_results.to_json())
    meta = data["meta"]
    for key in ("created", "git_commit", "host", "versions", "settings", "backends", "vendors"):
        assert key in meta
    assert meta["backends"]["cpu"]["device"] and meta["versions"]["numpy"]
    assert meta["git_commit"] != ""
    row = next(d for d in data["measurements"] if d["status"] == OK)
    assert row["samples"] and row["stats"]["median"] > 0 and row["gflops"] > 0
    again = Results.from_json(cpu_results.to_json())
    assert [m.to_dict() for m in again.measurements] == data["measurements"]


def test_markdown_tables_show_failed_never_a_speed(cpu_results: Results) -> None:
    md = report.to_markdown(cpu_results)
    for title in ("First call vs steady", "GFLOP/s by size and block size",
                  "Outputs per thread", "Ladder"):
        assert title in md
    broken_rows = [line for line in md.splitlines() if line.startswith("| broken_fake")]
    assert broken_rows and all(line.count(FAILED) >= 2 for line in broken_rows)
    ladder_row = next(line for line in md.splitlines()
                      if line.startswith("| 90 | broken_fake"))
    cells = [c.strip() for c in ladder_row.split("|")[1:-1]]
    assert cells[3] == "defaults"  # parameters from
    assert cells[4] == FAILED and cells[7] == FAILED  # verified, GFLOP/s
    assert cells[5] == cells[6] == cells[8] == "—"  # no time, no spread, no share
    assert "FAILED broken_fake at 16³: wrong result" in md
    for col in ("median ms", "IQR ms", "GFLOP/s", "% of NumPy"):
        assert col in md


def test_csv_has_one_row_per_measurement(cpu_results: Results) -> None:
    rows = list(csv.DictReader(io.StringIO(report.to_csv(cpu_results))))
    assert len(rows) == len(cpu_results.measurements)
    assert set(report.CSV_FIELDS) <= set(rows[0])
    assert {r["status"] for r in rows} >= {OK, FAILED}


def test_plot_is_a_png(cpu_results: Results, tmp_path: Path) -> None:
    from tilegemm.bench.plot import plot_sizes

    out = plot_sizes(cpu_results, tmp_path / "sizes.png")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_cli_renders_a_saved_file(cpu_results: Results, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(cpu_results.to_json())
    assert main(["bench", "--from-json", str(path), "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "### Ladder" in out and "broken_fake" in out
    assert main(["bench", "--from-json", str(tmp_path / "missing.json")]) == 2


def test_cli_runs_writes_files_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    rc = main(["bench", "--backend", "cpu", "--sizes", "8,16", "--ladder-sizes", "16",
               "--compile-size", "8", "--reports", "sizes,ladder,compile", "--budget", "0.01",
               "--min-reps", "1", "--warmup", "0", "--quiet", "--output", str(out),
               "--plot", str(tmp_path / "cpu.png"), "--save", str(tmp_path / "saved")])
    assert rc == 0
    res = Results.load(out)
    assert res.for_report("ladder", "cpu") and not res.failed
    # The ladder also ran what kernel="auto" runs here, verified like every rung.
    auto = [m for m in res.for_report("ladder", "cpu")
            if any(s.startswith("auto: ") for s in m.sources)]
    assert len(auto) == 1 and auto[0].status == OK
    assert (tmp_path / "cpu.png").read_bytes()[:8] == PNG_MAGIC
    saved = sorted(p.suffix for p in (tmp_path / "saved").iterdir())
    assert saved == [".json", ".md", ".png"]


def test_cli_exit_status_is_1_when_a_kernel_fails(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    _register(monkeypatch)
    rc = main(["bench", "--backend", "cpu", "--reports", "ladder", "--ladder-sizes", "8",
               "--budget", "0.01", "--quiet", "--output", str(tmp_path / "x.csv")])
    assert rc == 1
    assert "FAILED" in (tmp_path / "x.csv").read_text()


def test_cli_rejects_bad_lists() -> None:
    from tilegemm.commands.bench import _int_list

    assert _int_list("8..64") == (8, 16, 32, 64)
    assert _int_list("3,5") == (3, 5)
    with pytest.raises(SystemExit):
        main(["bench", "--sizes", "8..x"])
    with pytest.raises(SystemExit):
        main(["bench", "--reports", "sizes,nope"])


def test_host_fallback_when_backend_cannot_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backends without prepare() are timed through tilegemm.matmul(out=...), still verified
    first with a NaN-poisoned output (so the broken fake fails there too)."""
    be = get_backend("cpu")

    def no_prepare(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    monkeypatch.setattr(type(be), "prepare", no_prepare)
    _register(monkeypatch)
    specs = {"cpu": [registry.specs_for("cpu")[0], BROKEN]}
    state = run_plan(plan(["cpu"], Settings.quick(reports=("ladder",), ladder_sizes=(9,)),
                          specs_for=specs.__getitem__), TINY, state=RunState())
    by = {m.kernel: m for m in state.measurements}
    good = by[registry.specs_for("cpu")[0].name]
    assert good.status == OK and "tilegemm.matmul" in good.method
    assert by["broken_fake"].status == FAILED and "wrong result" in by["broken_fake"].reason


class _OneGflopBackend(Backend):
    """Correct results, fake timings of exactly 1 GFLOP/s (no real waiting)."""

    name = "cpu"

    def status(self) -> BackendStatus:
        return BackendStatus("cpu", True, "fake")

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise AssertionError

    def prepare(self, spec, params, prob, a3, b3, target=None) -> Prepared:  # type: ignore[no-untyped-def]
        out = np.matmul(a3, b3)
        t = prob.flops / 1e9
        return Prepared(lambda: None, lambda: out, lambda n: [t] * n)


def test_cases_predicted_too_slow_are_skipped_not_run() -> None:
    be = _OneGflopBackend()
    settings = Settings.quick(reports=("sizes",), sizes=(64, 128, 1024, 2048),
                              max_call_s=0.5, policy=Policy(warmup=0, min_reps=1, max_reps=2))
    cases = [c for c in plan(["cpu"], settings, specs_for=lambda b: [TILED])
             if c.spec is not None and dict(c.params)["TILE"] == 16]
    state = run_plan(cases, settings, backend_of=lambda name: be)
    status = {m.m: m.status for m in state.measurements}
    assert status == {64: OK, 128: OK, 1024: SKIPPED, 2048: SKIPPED}
    reason = next(m.reason for m in state.measurements if m.m == 1024)
    assert "2.15 s per call" in reason and "--max-call-seconds" in reason
    # 0 is no limit, as in tune (it skipped every case after the first)
    unlimited = run_plan(cases, replace(settings, max_call_s=0.0), backend_of=lambda name: be)
    assert {m.status for m in unlimited.measurements} == {OK}


def test_case_labels_and_keys() -> None:
    c = Case("sizes", "cpu", 8, 8, 8, TILED, (("TILE", 8), ("R", 4)))
    assert c.key == ("cpu", "cpu:tiled_fake", (("TILE", 8), ("R", 4)), 8, 8, 8)
    assert "TILE=8 R=4" in c.label and c.flops == 1024


@pytest.mark.opencl
def test_tiny_sweep_on_opencl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first calls and the ladder on PoCL (the CPU run above covers every report: the
    block-size and R sweeps here built 25 programs more, 20 s on 2 vCPUs), the vendor a
    stand-in for CLBlast computing on the host (the real library's first call compiles its
    kernels for half a minute; test_bench_vendors checks the call against its signature)."""
    import sys
    import types

    def gemm(queue, m, n, k, a, b, c, a_ld, b_ld, c_ld):  # type: ignore[no-untyped-def]
        c.set(np.matmul(a.get(), b.get()).astype(c.dtype), queue=queue)

    monkeypatch.setitem(sys.modules, "pyclblast", types.SimpleNamespace(gemm=gemm))
    res = run_bench(["opencl"], Settings.quick(reports=("compile", "ladder"), ladder_sizes=(16,),
                                               compile_size=16, policy=TINY.policy))
    assert res.for_report("ladder", "opencl")
    assert not res.failed, [f"{m.variant}: {m.reason}" for m in res.failed]
    assert "Ladder — opencl" in report.to_markdown(res)


def test_environment_slugs_and_commit(tmp_path: Path) -> None:
    from tilegemm.bench.environment import git_commit, slug

    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz") == "intel-xeon-platinum-8480"
    assert git_commit(tmp_path) == "unknown"  # not a repository


def test_the_commit_is_tilegemms_own_not_an_enclosing_repositorys(monkeypatch,
                                                                    tmp_path: Path) -> None:
    """Installed inside another repository (a project's virtual environment or --target
    folder), the package recorded that project's commit as tilegemm's in every results
    file. A repository whose top level is not tilegemm's checkout now gives "unknown"."""
    import subprocess

    from tilegemm.bench import environment

    own = environment._CHECKOUT
    if (own / ".git").exists():  # running from a checkout: its own commit
        assert environment.git_commit() != "unknown"
    monkeypatch.setattr(environment, "_CHECKOUT", tmp_path / "elsewhere")
    assert environment.git_commit() == "unknown"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert environment.git_commit(tmp_path) == "unknown"  # asked for: no commit yet


def test_results_file_names_follow_the_device(cpu_results: Results) -> None:
    stem = cpu_results.default_stem()
    assert stem.startswith("cpu-") and stem.endswith(cpu_results.meta["created"][:10])
    gpu = Results({"created": "2030-01-02T00:00:00", "backends": {
        "cuda": {"device": "NVIDIA H200"}}}, [m for m in cpu_results.measurements[:1]])
    gpu.measurements[0] = type(gpu.measurements[0]).from_dict(
        {**gpu.measurements[0].to_dict(), "backend": "cuda"})
    assert gpu.default_stem() == "nvidia-h200-2030-01-02"


def test_results_file_names_are_short_for_opencl_devices(cpu_results: Results) -> None:
    """It saved '0-pthread-intel-xeon-processor-portable-computing-language-default-<date>'."""
    device = ("[0] pthread-Intel(R) Xeon(R) Platinum 8480+ (cpu, Portable Computing Language) "
              "default")
    res = Results({"created": "2030-01-02T00:00:00", "backends": {"opencl": {"device": device}}},
                  [m for m in cpu_results.measurements[:1]])
    res.measurements[0] = type(res.measurements[0]).from_dict(
        {**res.measurements[0].to_dict(), "backend": "opencl"})
    assert res.default_stem() == "opencl-pocl-intel-xeon-platinum-8480-2030-01-02"


def test_noisy_timings_are_flagged_in_the_tables(cpu_results: Results) -> None:
    """A busy machine printed '4748.9 % of NumPy' with no warning."""
    from dataclasses import replace

    ladder = [m for m in cpu_results.measurements if "ladder" in m.reports]
    vendor = next(m for m in ladder if m.vendor and m.status == OK)
    rung = next(m for m in ladder if not m.vendor and m.status == OK)
    steady = [1.0, 1.0, 1.0, 1.0]
    quiet = [replace(m, samples=steady) if m.samples else m for m in cpu_results.measurements]
    text = report.to_markdown(Results(cpu_results.meta, quiet), ["ladder"])
    assert "noisy timing" not in text
    # The vendor's own spread is what makes every ratio unreliable: flagged too.
    loud = [replace(m, samples=[1.0, 1.0, 3.0, 9.0]) if m is vendor else
            replace(m, samples=steady) if m.samples else m
            for m in cpu_results.measurements]
    text = report.to_markdown(Results(cpu_results.meta, loud), ["ladder"])
    assert "noisy timing" in text and vendor.kernel in text.split("noisy timing")[1]
    row = next(line for line in text.splitlines() if f"| {rung.kernel} |" in line)
    assert report.NOISY_MARK.strip() in row


def test_plot_without_a_size_sweep_fails_before_running(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]):
    """It ran the whole benchmark, then failed to plot."""
    import tilegemm.bench.sweeps as sweeps

    ran = []
    monkeypatch.setattr(sweeps, "run_bench", lambda *a, **k: ran.append(1))
    assert main(["bench", "--backend", "cpu", "--reports", "ladder", "--quiet",
                 "--plot", str(tmp_path / "x.png")]) == 2
    assert not ran and "--plot" in capsys.readouterr().err


def test_plot_legends_sit_outside_the_panels(cpu_results: Results, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Legends covered the lines of the slow rungs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tilegemm.bench.plot import plot_sizes

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig: figs.append(fig))
    plot_sizes(cpu_results, tmp_path / "p.png")
    fig = figs[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        box = legend.get_window_extent(renderer)
        panel = ax.get_window_extent(renderer)
        assert box.x0 >= panel.x1 - 1, "legend overlaps the plotting area"
    plt.close("all")


def test_save_lists_every_file_it_wrote(cpu_results: Results, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(cpu_results.to_json())
    assert main(["bench", "--from-json", str(path), "--quiet", "--save",
                 str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    for suffix in (".json", ".md", ".png"):
        assert any(line.startswith("wrote ") and line.endswith(suffix)
                   for line in err.splitlines()), err


def test_a_saved_subset_without_sizes_writes_no_plot(cpu_results: Results, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """--from-json F --reports ladder --save DIR wrote a plot of the size sweep beside a
    JSON without it (which then could not plot again); --plot with such --reports drew
    the sweep that was not asked for."""
    path = tmp_path / "r.json"
    path.write_text(cpu_results.to_json())
    assert main(["bench", "--from-json", str(path), "--reports", "ladder", "--quiet",
                 "--save", str(tmp_path / "out")]) == 0
    assert sorted(p.suffix for p in (tmp_path / "out").iterdir()) == [".json", ".md"]
    capsys.readouterr()
    assert main(["bench", "--from-json", str(path), "--reports", "ladder", "--quiet",
                 "--plot", str(tmp_path / "p.png")]) == 2
    assert "--plot draws the 'sizes' report" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_plot_title_keeps_dirty_on_the_commit() -> None:
    from tilegemm.bench.plot import title

    commit = "7bb5afa0607f" + "0" * 28
    meta = {"settings": {"dtype": "float32"}, "created": "2026-11-25"}
    assert "commit 7bb5afa0607f-dirty," in title(Results({**meta, "git_commit":
                                                                commit + "-dirty"}))
    assert "commit 7bb5afa0607f," in title(Results({**meta, "git_commit": commit}))


def test_tensor_core_plans_pin_the_precision_and_ieee_plans_leave_them_out() -> None:
    mma = registry.get("mma", "cuda")
    ieee = plan(["cuda"], Settings.quick(reports=("ladder",)))
    assert ieee and all(c.spec is not mma for c in ieee)
    for settings, passes in ((Settings.quick(reports=("ladder",), precision="tf32"), 1),
                             (Settings.quick(reports=("ladder",), precision="3xtf32"), 3),
                             (Settings.quick(reports=("ladder",), dtype="bfloat16"), 1)):
        cases = plan(["cuda"], settings)
        rungs = [c for c in cases if c.spec is not None]
        # only the tensor-core rungs that compute it, at that precision (kernel="auto"'s
        # choice too, where CUDA runs here: the simulator)
        assert [c.spec.name for c in rungs if c.source == "defaults"] == ["mma", "wgmma"]
        assert all(dict(c.params)["PASSES"] == passes for c in rungs)
        assert any(c.spec is None for c in cases)  # and the reference at that precision


def test_bench_cli_refuses_a_precision_for_16bit_data() -> None:
    import argparse

    from tilegemm.commands.bench import add_arguments, settings_from
    from tilegemm.errors import InvalidValueError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(InvalidValueError, match="--precision tf32 applies to --dtype float32"):
        settings_from(parser.parse_args(["--dtype", "float16", "--precision", "tf32"]))
    assert settings_from(parser.parse_args(["--precision", "3xtf32"])).precision == "3xtf32"


def test_cpu_results_stem_names_isa_and_model(monkeypatch) -> None:
    """Two machines with the same vendor string but different ISA or model get different
    results files (generic names like "Intel(R) Xeon(R) Processor" are common under KVM)."""
    from tilegemm.bench import environment

    monkeypatch.setattr(environment, "cpu_name", lambda: "Intel(R) Xeon(R) Processor")
    monkeypatch.setattr(environment, "cpu_family_model", lambda: "6-207")
    assert (environment.cpu_results_stem("cpu-blocked", "avx512")
            == "cpu-blocked-intel-xeon-processor-avx512-m6-207")
    monkeypatch.setattr(environment, "cpu_family_model", lambda: "6-143")
    assert environment.cpu_results_stem("cpu-auto", "avx512").endswith("-avx512-m6-143")
    monkeypatch.setattr(environment, "cpu_family_model", lambda: "")  # no /proc/cpuinfo
    assert (environment.cpu_results_stem("cpu-auto", "avx2")
            == "cpu-auto-intel-xeon-processor-avx2")


def test_numpy_blas_names_the_kernels_openblas_picked() -> None:
    """A ratio to NumPy is read against the BLAS kernels NumPy ran: OpenBLAS may pick an
    older generation's (AVX2 "Haswell" on a Zen 5 EPYC), and results files record that."""
    import numpy as np

    from tilegemm.bench.environment import host_info, numpy_blas

    found = numpy_blas()
    assert host_info()["numpy_blas"] == found
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    if "openblas" in blas:  # the PyPI wheels' BLAS: the kernel generation is readable
        assert found["name"] == blas and found["openblas_kernels"].isidentifier(), found


def test_write_cpu_results_uses_the_stem(monkeypatch, tmp_path: Path, capsys) -> None:
    """The benchmark scripts' one writer names the file as cpu_results_stem does."""
    import json

    from tilegemm.bench import environment

    monkeypatch.setattr(environment, "cpu_name", lambda: "Intel(R) Xeon(R) Processor")
    monkeypatch.setattr(environment, "cpu_family_model", lambda: "6-167")
    path = environment.write_cpu_results(tmp_path, "dask-matmul", "avx512", {"x": 1}, indent=1)
    assert path == (tmp_path / "benchmarks" / "results"
                    / "dask-matmul-intel-xeon-processor-avx512-m6-167.json")
    assert json.loads(path.read_text()) == {"x": 1}
    assert capsys.readouterr().out.strip() == f"wrote {path.relative_to(tmp_path)}"


def test_a_rerun_keeps_the_earlier_runs_in_history(tmp_path: Path, capsys) -> None:
    """A second run of a benchmark replaced the results file the documentation cited;
    now the earlier documents go into ``history``, oldest first, and a file that is not
    JSON is kept as its text."""
    import json

    from tilegemm.bench import environment

    path = tmp_path / "r.json"
    for run in (1, 2, 3):
        environment.write_results(path, {"run": run, "ratio": run / 10})
    doc = json.loads(path.read_text())
    assert doc["run"] == 3
    assert doc["history"] == [{"run": 1, "ratio": 0.1}, {"run": 2, "ratio": 0.2}]
    path.write_text("{not json")
    environment.write_results(path, {"run": 4})
    assert json.loads(path.read_text()) == {"run": 4, "history": [{"unparsed": "{not json"}]}
    path.write_bytes(b"\xff{")  # not UTF-8 either: kept as text, not a crash after the run
    environment.write_results(path, {"run": 5})
    assert json.loads(path.read_text())["history"][-1] == {"unparsed": "\ufffd{"}
    capsys.readouterr()


def test_flush_l2_flushes_the_reference_too_and_the_header_says_where() -> None:
    """--flush-l2 flushed the rungs' cache between repeats but never NumPy's, the 100 %
    reference: cold rungs against a warm vendor. And the header said "flushed" for a
    backend without a flusher (OpenCL)."""
    from tilegemm.bench.report import header_lines

    settings = Settings.quick(reports=("ladder",), ladder_sizes=(9,), rivals=False,
                              policy=Policy(warmup=0, min_reps=2, max_reps=2, budget_s=0.01,
                                            flush=True))
    res = run_bench(["cpu"], settings, specs_for=lambda b: [TILED])
    timed = [m for m in res.measurements if m.samples]
    assert {m.vendor for m in timed} == {True, False}
    assert all(m.flushed for m in timed), [(m.kernel, m.flushed) for m in timed]
    assert "L2 flushed between reps" in header_lines(res)[-1]
    assert "not on" not in header_lines(res)[-1]
    # a backend whose measurements ran warm is named
    warm = Measurement(backend="opencl", kernel="x", m=9, n=9, k=9, samples=[1.0])
    mixed = Results(meta=res.meta, measurements=[*res.measurements, warm])
    assert "(not on opencl: no flusher)" in header_lines(mixed)[-1]
    only = Results(meta=res.meta, measurements=[warm])
    assert "L2 flush asked for but not available on opencl" in header_lines(only)[-1]


def test_first_calls_that_compiled_do_not_predict_later_sizes_too_slow() -> None:
    """--max-reps 0 (verify and first call only) took the smallest size's first call, which
    compiles the rung (seconds), as the time of a call and skipped every larger size as
    "too slow". A first call after an earlier size compiled still predicts the next."""
    now = [0.0]
    built: list[int] = []

    class SlowFirstBuild(_OneGflopBackend):
        def prepare(self, spec, params, prob, a3, b3, target=None):  # type: ignore[no-untyped-def]
            now[0] += (0.0 if built else 10.0) + prob.flops / 1e9  # compile once, 1 GFLOP/s
            built.append(1)
            return super().prepare(spec, params, prob, a3, b3, target)

    be = SlowFirstBuild()
    settings = Settings.quick(reports=("sizes",), sizes=(16, 32, 1024, 2048), max_call_s=5.0,
                              policy=Policy(warmup=0, min_reps=0, max_reps=0))
    cases = [c for c in plan(["cpu"], settings, specs_for=lambda b: [TILED])
             if c.spec is not None and dict(c.params)["TILE"] == 16]
    state = run_plan(cases, settings, backend_of=lambda name: be, clock=lambda: now[0])
    status = {m.m: m.status for m in state.measurements}
    assert status == {16: OK, 32: OK, 1024: OK, 2048: SKIPPED}, status


def test_save_never_overwrites_an_earlier_run(cpu_results: Results, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A second --save of the day replaced the first run's JSON and Markdown and left its
    plot beside them, drawn from the first run's data; each run now gets its own stem."""
    path = tmp_path / "r.json"
    path.write_text(cpu_results.to_json())
    out = tmp_path / "out"
    assert main(["bench", "--from-json", str(path), "--quiet", "--save", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(Path(n).suffix for n in first) == [".json", ".md", ".png"]
    stem = Path(next(n for n in first if n.endswith(".json"))).stem
    for _ in range(2):
        assert main(["bench", "--from-json", str(path), "--reports", "ladder", "--quiet",
                     "--save", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([*first, f"{stem}-2.json", f"{stem}-2.md", f"{stem}-3.json",
                            f"{stem}-3.md"])
    assert all((out / n).read_bytes() == data for n, data in first.items())
    assert f"wrote {out / stem}-3.json" in capsys.readouterr().err
