"""Triton's matmul as the rival timed beside cuBLAS.

Without a GPU (and without Triton: it is never installed in the test environment) the
glue is checked with stand-in ``triton`` and ``torch`` modules: the precision the dot is
asked for, that the launch grid and the tutorial's grouped tile order cover every tile of
an odd-shaped C under every autotuning configuration, the clean note when Triton is
missing, the ladder table's Triton row as a share of cuBLAS, and that nothing imports
Triton or PyTorch unless Triton is to be timed. On a GPU (``gpu``), the real kernel runs.
"""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

import tilegemm.bench
from conftest import FakeCudaEvent
from tilegemm.backends.base import Limits, Target
from tilegemm.bench import report as rp
from tilegemm.bench import vendors
from tilegemm.bench.reports.ladder import ladder_tables
from tilegemm.bench.results import Results
from tilegemm.bench.sweeps import Case, RunState, Settings, run_plan
from tilegemm.bench.timing import FAILED, OK, Measurement, Policy
from tilegemm.problem import GemmProblem
from tilegemm.reference import random_operands

POLICY = Policy(warmup=1, min_reps=2, max_reps=3, budget_s=0.01)
TARGET = Target("cuda", "Fake GPU", "gpu", "sm_90", Limits(1024), "CUDA events",
                accelerated=True, vendors=("cupy", "torch"))
MODULE = "tilegemm.bench.triton_matmul"


# --- stand-ins ----------------------------------------------------------------------------


class _Config:
    def __init__(self, kwargs: dict[str, int], num_warps: int = 4, num_stages: int = 3) -> None:
        self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages


class _Autotuned:
    """``triton.autotune``'s object: ``kernel[grid](...)`` runs the chosen configuration
    as the GPU would, program by program, each writing the tile ``tile_of`` gives it."""

    def __init__(self, fn, configs: list[_Config]) -> None:  # type: ignore[no-untyped-def]
        self.fn, self.configs, self.pick, self.launches = fn, configs, 0, []

    def __getitem__(self, grid):  # type: ignore[no-untyped-def]
        def launch(a, b, c, m, n, k, sam, sak, sbk, sbn, scm, scn, **meta):  # type: ignore[no-untyped-def]
            cfg = self.configs[self.pick]
            self.launches.append({"grid": grid, **meta})
            assert (sam, sak, sbk, sbn, scm, scn) == (*a.stride_pair(), *b.stride_pair(),
                                                      *c.stride_pair())
            tile_of = sys.modules[MODULE].tile_of
            bm, bn = cfg.kwargs["BLOCK_SIZE_M"], cfg.kwargs["BLOCK_SIZE_N"]
            product = np.matmul(a, b)
            for pid in range(grid(cfg.kwargs)[0]):
                pm, pn = tile_of(pid, m, n, bm, bn, cfg.kwargs["GROUP_SIZE_M"])
                rows, cols = slice(pm * bm, (pm + 1) * bm), slice(pn * bn, (pn + 1) * bn)
                c[rows, cols] = product[rows, cols]
            self.best_config = cfg
        return launch


def _fake_triton(
        dot_signature: str = "input_precision") -> tuple[types.ModuleType, types.ModuleType]:
    """``triton`` and ``triton.language`` whose ``jit`` leaves functions as plain Python."""
    tl = types.ModuleType("triton.language")
    tl.constexpr = object
    tl.cdiv = lambda a, b: -(-a // b)
    calls: list[dict[str, object]] = []
    if dot_signature == "input_precision":
        def dot(input, other, acc=None, input_precision=None, allow_tf32=None,  # type: ignore[no-untyped-def]
                max_num_imprecise_acc=None, out_dtype=None):
            calls.append({"acc": acc, "input_precision": input_precision})
            return "dot"
    else:  # Triton 2.x
        def dot(input, other, allow_tf32=True, out_dtype=None):  # type: ignore[no-untyped-def]
            calls.append({"allow_tf32": allow_tf32})
            return 1
    tl.dot = dot
    tl.calls = calls
    triton = types.ModuleType("triton")
    triton.__version__ = "0.fake"
    triton.language = tl
    triton.jit = lambda fn: fn
    triton.Config = _Config
    triton.cdiv = tl.cdiv
    triton.autotune = lambda configs, key: (lambda fn: _Autotuned(fn, configs))
    triton.runtime = types.SimpleNamespace(driver=types.SimpleNamespace(
        active=types.SimpleNamespace(utils=object())))
    return triton, tl


class _Tensor(np.ndarray):
    """A PyTorch CUDA tensor as far as the vendor uses one."""

    def cuda(self):  # type: ignore[no-untyped-def]
        return self

    def cpu(self):  # type: ignore[no-untyped-def]
        return self

    def numpy(self):  # type: ignore[no-untyped-def]
        return np.asarray(self)

    def stride(self, i: int) -> int:
        return self.strides[i] // self.itemsize

    def stride_pair(self) -> tuple[int, int]:
        return self.stride(0), self.stride(1)

    @property
    def device(self) -> str:
        return "cuda:0"


def _fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "0.fake"
    torch.from_numpy = lambda a: np.array(a).view(_Tensor)
    torch.full = lambda shape, fill, dtype, device: np.full(shape, fill, dtype).view(_Tensor)
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, Event=FakeCudaEvent,
                                       synchronize=lambda: None)
    return torch


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """Stand-in triton and torch importable; the Triton module imported afresh on them."""
    triton, tl = _fake_triton()
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.language", tl)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    yield triton
    _forget_module()


def _forget_module() -> None:
    sys.modules.pop(MODULE, None)
    if hasattr(tilegemm.bench, "triton_matmul"):
        delattr(tilegemm.bench, "triton_matmul")


def _import_with(monkeypatch: pytest.MonkeyPatch, dot_signature: str) -> types.ModuleType:
    triton, tl = _fake_triton(dot_signature)
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.language", tl)
    _forget_module()
    import tilegemm.bench.triton_matmul as tm

    return tm


def _problem(m: int, n: int, k: int, dtype: str = "float32"):  # type: ignore[no-untyped-def]
    prob = GemmProblem(m=m, n=n, k=k, dtype=np.dtype(dtype), batch_shape=(1,))
    a3, b3 = random_operands((1, m, k), (1, k, n), np.dtype(dtype))
    return prob, a3, b3


# --- precision, grid, tile order ----------------------------------------------------------


@pytest.mark.parametrize(("math", "asked"), [("native", "ieee"), ("tf32", "tf32")])
def test_float32_runs_ask_the_dot_for_ieee_or_tf32(fake_gpu: types.ModuleType, math: str,
                                                   asked: str) -> None:
    """FP32 without TF32 for the FFMA rungs and SGEMM, TF32 for the tensor-core comparison:
    Triton's own float32 default is TF32, so "ieee" must be passed explicitly."""
    v = vendors._triton_vendor(TARGET, np.dtype("float32"), math)
    prob, a3, b3 = _problem(40, 24, 16)
    m = vendors.measure_vendor(v, "cuda", prob, a3, b3, POLICY)
    assert m.status == OK, m.reason
    launches = sys.modules[MODULE].matmul_kernel.launches
    assert launches and {x["INPUT_PRECISION"] for x in launches} == {asked}
    assert v.math == math and (("TF32" in v.name) == (math == "tf32"))


def test_new_triton_gets_input_precision_and_old_triton_allow_tf32(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tm = _import_with(monkeypatch, "input_precision")
    assert tm.DOT_PRECISION_KEYWORD == "input_precision"
    tm._dot("a", "b", "acc", "ieee")
    assert sys.modules["triton.language"].calls[-1] == {"acc": "acc", "input_precision": "ieee"}

    tm = _import_with(monkeypatch, "allow_tf32")  # before Triton 3.0: no acc, a flag
    assert tm.DOT_PRECISION_KEYWORD == "allow_tf32"
    calls = sys.modules["triton.language"].calls
    assert tm._dot(None, None, 41, "ieee") == 42 and calls[-1] == {"allow_tf32": False}
    assert tm._dot(None, None, 41, "tf32") == 42 and calls[-1] == {"allow_tf32": True}
    _forget_module()


@pytest.mark.parametrize(("m", "n"), [(1, 1), (100, 33), (257, 1000), (4097, 65)])
def test_grid_and_grouped_order_cover_every_tile_once(fake_gpu: types.ModuleType, m: int,
                                                      n: int) -> None:
    """Under every configuration the autotuner may choose, the programs of the launch grid
    map one to one onto the tiles of an m × n C, partial edge tiles included."""
    import tilegemm.bench.triton_matmul as tm

    for cfg in tm.autotune_configs():
        bm, bn = cfg.kwargs["BLOCK_SIZE_M"], cfg.kwargs["BLOCK_SIZE_N"]
        programs = tm.grid(m, n)(cfg.kwargs)[0]
        tiles = [tm.tile_of(pid, m, n, bm, bn, cfg.kwargs["GROUP_SIZE_M"])
                 for pid in range(programs)]
        want = {(i, j) for i in range(-(-m // bm)) for j in range(-(-n // bn))}
        assert len(tiles) == len(want) and set(tiles) == want, (bm, bn)


def test_configs_are_the_tutorials_sixteen_for_cuda(fake_gpu: types.ModuleType) -> None:
    import tilegemm.bench.triton_matmul as tm

    configs = tm.autotune_configs()
    assert len(configs) == 16 and len({tuple(c.kwargs.values()) + (c.num_stages, c.num_warps)
                                       for c in configs}) == 16
    assert configs[0].kwargs == {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64,
                                 "GROUP_SIZE_M": 8}
    assert (configs[0].num_stages, configs[0].num_warps) == (3, 8)


@pytest.mark.parametrize("pick", [0, 7])  # the largest tile; a 32×64 one
def test_an_odd_product_is_verified_and_records_the_chosen_config(
        fake_gpu: types.ModuleType, pick: int) -> None:
    """The output starts as NaN and is checked against float64, so a tile the launch never
    writes fails; the chosen configuration is kept as the measurement's parameters."""
    v = vendors._triton_vendor(TARGET, np.dtype("float32"), "native")
    kernel = sys.modules[MODULE].matmul_kernel
    kernel.pick = pick
    prob, a3, b3 = _problem(129, 70, 33)
    m = vendors.measure_vendor(v, "cuda", prob, a3, b3, POLICY)
    assert m.status == OK and m.vendor and m.kernel == "Triton" and m.samples
    bm, bn, bk, stages, warps = sys.modules[MODULE].CUDA_CONFIGS[pick]
    assert m.params == {"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8, "warps": warps,
                        "stages": stages}
    assert "triton 0.fake" in v.note and 'input_precision="ieee"' in v.note


def test_a_short_grid_fails_verification(fake_gpu: types.ModuleType,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a grid one program short leaves NaN in C."""
    import tilegemm.bench.triton_matmul as tm

    real = tm.grid
    monkeypatch.setattr(tm, "grid", lambda m, n: lambda meta: (real(m, n)(meta)[0] - 1,))
    v = vendors._triton_vendor(TARGET, np.dtype("float32"), "native")
    prob, a3, b3 = _problem(129, 70, 33)
    m = vendors.measure_vendor(v, "cuda", prob, a3, b3, POLICY)
    assert m.status == FAILED and "wrong result" in m.reason and m.params == {}


# --- absent, and never imported when not used ---------------------------------------------


def test_without_triton_the_rival_is_one_line_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = _fake_torch()

    def no_driver() -> bool:
        raise RuntimeError("CUDA driver initialization failed\n  (error 999)")

    torch.cuda.is_available = no_driver
    monkeypatch.setitem(sys.modules, "torch", torch)
    v, note = vendors.find_rival("triton", TARGET, "float32")
    assert note == ("Triton not timed: RuntimeError: CUDA driver initialization failed "
                    "(error 999)")
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setitem(sys.modules, "triton", None)  # import fails
    v, note = vendors.find_rival("triton", TARGET, "float32")
    assert v is None and note.startswith("Triton not timed: ")
    assert "triton" in note.split(": ", 1)[1]
    assert "\n" not in note
    v, note = vendors.find_rival("triton", TARGET, "float64")
    assert v is None and "float64" in note


def test_rivals_only_on_a_real_cuda_device() -> None:
    assert vendors.rivals_for(TARGET) == ("triton",)
    cpu = Target("cpu", "host", "cpu", "x86_64", Limits(0), "perf_counter", vendors=("numpy",))
    sim = Target("cuda", "simulator", "simulator", "", Limits(1024), "CUDA events",
                 simulated=True)
    assert vendors.rivals_for(cpu) == () and vendors.rivals_for(sim) == ()


def test_a_missing_rival_is_a_note_not_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep: the vendor is measured, the absent rival leaves a note and no measurement."""
    monkeypatch.setitem(sys.modules, "triton", None)

    class Backend:
        name = "cpu"

        def target(self) -> Target:
            return Target("cpu", "host", "cpu", "x86_64", Limits(0), "perf_counter",
                          vendors=("numpy",))

    cases = [Case("ladder", "cpu", 8, 8, 8), Case("ladder", "cpu", 8, 8, 8, rival="triton")]
    state = run_plan(cases, Settings.quick(policy=POLICY), backend_of=lambda name: Backend(),
                     state=RunState())
    assert [m.kernel for m in state.measurements] == [vendors.numpy_vendor().name]
    assert state.rival_notes["cpu"]["triton"].startswith("Triton not timed")
    assert cases[0].key != cases[1].key


def test_tilegemm_and_cpu_benches_import_neither_triton_nor_torch() -> None:
    code = """
import importlib.abc, sys
tried = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("triton", "torch"):
            tried.append(name)
        return None
sys.meta_path.insert(0, Spy())
import tilegemm
from tilegemm.bench.sweeps import Settings, plan, run_plan
from tilegemm.bench.timing import Policy
s = Settings.quick(reports=("ladder",), ladder_sizes=(8,),
                   policy=Policy(warmup=0, min_reps=1, max_reps=1, budget_s=0.01))
run_plan([c for c in plan(["cpu"], s) if c.spec is None], s)
print(tried)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# --- the ladder table -----------------------------------------------------------------------


def _row(kernel: str, seconds: float, vendor: bool = False, **params: int) -> Measurement:
    return Measurement(backend="cuda", kernel=kernel, m=64, n=64, k=64, params=params,
                       rung=None if vendor else 3, vendor=vendor, samples=[seconds] * 5,
                       reports=["ladder"], method="CUDA events")


def test_ladder_shows_triton_as_a_share_of_cublas() -> None:
    """Triton sorts before cuBLAS among the vendor rows; the share is still of cuBLAS."""
    results = Results(
        {"vendor_names": {"cuda": "cuBLAS (CuPy)"},
         "vendors": {"cuda": "cupy 0.fake, CUPY_TF32=0: FP32 compute, no TF32"},
         "rivals": {"cuda": {"triton": "Triton: triton 0.fake, the tutorial matmul"}}},
        [_row("shared", 4e-3), _row("Triton", 2e-3, True, BM=128, BN=64),
         _row("cuBLAS (CuPy)", 1e-3, True)])
    (table,) = ladder_tables(results)
    assert table.columns[-1] == "% of cuBLAS"
    rows = {r[1]: r for r in table.rows}
    assert rows["Triton"][-1] == "50.0%" and rows["cuBLAS (CuPy)"][-1] == "100.0%"
    assert rows["shared"][-1] == "25.0%" and rows["Triton"][2] == "BM=128 BN=64"
    assert "Triton: triton 0.fake, the tutorial matmul" in table.notes


def test_old_results_without_names_take_the_first_vendor_row() -> None:
    rows = [_row("shared", 4e-3), _row("cuBLAS (CuPy)", 1e-3, True)]
    assert rp.reference(Results({}, rows), "cuda", rows) is rows[1]


# --- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "precision"),
                         [("float32", "ieee"), ("float32", "tf32"), ("bfloat16", "ieee")])
def test_the_real_kernel_on_an_odd_shape(monkeypatch: pytest.MonkeyPatch, dtype: str,
                                         precision: str) -> None:
    """Compiled by the installed Triton and autotuned over two of the tutorial's
    configurations (the largest tile, too large for float32 TF32's shared memory on some
    GPUs, and the smallest: two compiles, not sixteen), then checked against float64 at
    the run's own precision on a NaN-filled output."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from tilegemm.backends import get_backend

    math = vendors.vendor_math(dtype, precision)
    v, note = vendors.find_rival("triton", get_backend("cuda").target(), dtype, math)
    assert v is not None, note
    kernel = sys.modules[MODULE].matmul_kernel
    monkeypatch.setattr(kernel, "configs", [kernel.configs[0], kernel.configs[7]])
    prob, a3, b3 = _problem(257, 130, 91, dtype)
    m = vendors.measure_vendor(v, "cuda", prob, a3, b3, POLICY)
    assert m.status == OK, m.reason
    assert set(m.params) == {"BM", "BN", "BK", "GROUP_M", "warps", "stages"}


def test_only_the_ladder_plans_the_rival(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm.bench import sweeps

    monkeypatch.setattr(sweeps, "_rivals", lambda backend: ("triton",))
    settings = Settings.quick(sizes=(8,), ladder_sizes=(8, 16), compile_size=8, r_size=8)
    rival = [c for c in sweeps.plan(["cpu"], settings) if c.rival]
    assert sorted((c.report, c.m) for c in rival) == [("ladder", 8), ("ladder", 16)]


def test_no_rivals_plans_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench --no-rivals`` (a run under a hard time limit) plans no rival case at all."""
    from tilegemm.bench import sweeps
    from tilegemm.cli import build_parser
    from tilegemm.commands.bench import settings_from

    monkeypatch.setattr(sweeps, "_rivals", lambda backend: ("triton",))
    args = build_parser().parse_args(["bench", "--backend", "cpu", "--reports", "ladder",
                                      "--ladder-sizes", "8", "--no-rivals"])
    settings = settings_from(args)
    assert not settings.rivals
    assert [c for c in sweeps.plan(["cpu"], settings) if c.rival] == []
    assert [c for c in sweeps.plan(["cpu"], replace(settings, rivals=True)) if c.rival]
