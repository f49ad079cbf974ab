"""The faster numba-cuda lowering step (tilegemm.kernels.cuda._numba_compile) decides the
same singly-assigned variables as numba-cuda's own, and one lowering gives each
architecture's PTX exactly as ``numba.cuda.compile_ptx`` does. Compile-only, no GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilegemm
from tilegemm.analysis.resources import ARCHS, compile_ptx_all
from tilegemm.kernels.cuda import _numba_compile
from tilegemm.registry import get

pytestmark = pytest.mark.ptx


def _normalise(ptx: str) -> str:
    """Drop the per-compile counters and ids numba puts in symbol names."""
    ptx = re.sub(r"_ZN[0-9A-Za-z_$]+", "SYMBOL", ptx)
    return re.sub(r"_cudapy_smem_\d+", "smem", ptx)


def _sm90_ptx(name: str) -> str:
    """The PTX of ``name`` at its float32 defaults for sm_90, through numba-cuda."""
    from numba.cuda import compile_ptx

    spec = get(name, "cuda")
    program = spec.program(spec.defaults(), np.dtype("float32"))
    text, _ = compile_ptx(program.kernel.py_func, program.signature("float32"),
                          cc=ARCHS["sm_90"])
    return _normalise(text)


@pytest.mark.parametrize("name", ["naive", "shared", "register2d"])
def test_patched_search_finds_the_same_variables(name: str, monkeypatch) -> None:
    from numba.cuda import compile_ptx, lowering

    _numba_compile.install()
    lower = lowering.Lower
    seen: list[tuple[set[str], set[str]]] = []

    def both(self) -> None:
        lower._tilegemm_original_find_singly_assigned(self)
        original = set(self._singly_assigned_vars)
        _numba_compile._find_singly_assigned_variable(self)
        seen.append((original, set(self._singly_assigned_vars)))

    monkeypatch.setattr(lower, "_find_singly_assigned_variable", both)
    spec = get(name, "cuda")
    program = spec.program(spec.defaults(), np.dtype("float32"))
    compile_ptx(program.kernel.py_func, program.signature("float32"), cc=ARCHS["sm_90"])
    assert seen and any(original for original, _ in seen)
    for original, patched in seen:
        assert patched == original


# Cheap rungs: the property belongs to the compile path, not to the kernel. Every rung,
# the generated ones included, compiles through compile_ptx_all in test_cuda_resources;
# three separate compiles of mma or pipelined here took 150 s and 47 s.
@pytest.mark.parametrize("name", ["naive", "register2d"])
def test_one_lowering_gives_each_architectures_ptx(name: str) -> None:
    from numba.cuda import compile_ptx

    spec = get(name, "cuda")
    params = spec.defaults()
    program = spec.program(params, np.dtype("float32"))
    bounds = program.kernel.targetoptions.get("launch_bounds")
    together = compile_ptx_all(spec, params, "float32")
    assert set(together) == set(ARCHS)
    for arch, cc in ARCHS.items():
        alone, _ = compile_ptx(program.kernel.py_func, program.signature("float32"), cc=cc,
                               launch_bounds=bounds)
        assert _normalise(together[arch]) == _normalise(alone), arch
    assert together["sm_80"] != together["sm_90"]


def _typing_context() -> type:
    from numba.cuda.typing import context

    return context.BaseContext


def _function_type() -> type:
    from numba.core.types import functions

    return functions.BaseFunction


# (the class patched, its method, the most lookups the memory may leave): within one type
# inference a call typed once is looked up after (register2d's unrolled tile repeats more
# than half of its calls; the written-out rungs 96 %); within one lowering an operator's
# signature looked up once is too (register2d: 95 of 162 lookups; written out, 99 % repeat).
MEMORIES = [pytest.param(_typing_context, "resolve_function_type", 1 / 2, id="typing"),
            pytest.param(_function_type, "get_call_type", 2 / 3, id="lowering")]


@pytest.mark.parametrize(("owner", "method", "at_most"), MEMORIES)
def test_remembered_answers_give_the_same_ptx_with_fewer_lookups(
        owner, method: str, at_most: float, monkeypatch) -> None:  # noqa: ANN001
    _numba_compile.install()
    cls = owner()
    kept = f"_tilegemm_original_{method}"
    original = getattr(cls, kept)
    asked: list[int] = []

    def counted(self, *args):  # noqa: ANN001, ANN002, ANN202
        asked.append(1)
        return original(self, *args)

    monkeypatch.setattr(cls, kept, counted)  # the patched method asks the original by name
    remembered = _sm90_ptx("register2d")
    with_memory, asked[:] = len(asked), []
    monkeypatch.setattr(cls, method, counted)  # every lookup asked anew
    assert _sm90_ptx("register2d") == remembered
    assert 0 < with_memory < len(asked) * at_most, (with_memory, len(asked))


# shared: phi nodes put in front of a block move the statements that name the variables
# fixed after them (a position not moved with them gave other PTX for naive, coalesced
# and shared); register2d: many variables fixed, in a long unrolled block.
@pytest.mark.parametrize("name", ["shared", "register2d"])
def test_ssa_hands_over_only_what_names_the_variable_and_gives_the_same_ptx(
        name: str, monkeypatch) -> None:
    """numba-cuda's SSA reconstruction passes every statement of every block to its
    handlers twice for each variable it fixes (quadratic in a written-out rung: 1.9 of
    12 s compiling pipelined); only those that name the variable can change. Handing over
    only those gives the same PTX (register2d: 190 statements handed over instead of
    13056)."""
    from numba.cuda.core import ssa

    _numba_compile.install()
    handed: list[int] = []
    for cls in (ssa._FixSSAVars, ssa._FreshVarHandler):
        for method in ("on_assign", "on_other"):
            real = getattr(cls, method)

            def counted(self, states, stmt, real=real):  # noqa: ANN001, ANN202
                handed.append(1)
                return real(self, states, stmt)

            monkeypatch.setattr(cls, method, counted)
    fewer = _sm90_ptx(name)
    patched, handed[:] = len(handed), []
    monkeypatch.setattr(ssa, "_run_ssa", ssa._tilegemm_original_run_ssa)
    monkeypatch.setattr(ssa, "_run_block_rewrite", ssa._tilegemm_original_run_block_rewrite)
    assert _sm90_ptx(name) == fewer
    assert 0 < patched < len(handed) / 20, (patched, len(handed))


def test_every_cuda_rung_is_listed() -> None:
    # the fix is installed on the path every rung compiles through (kernel_jit)
    assert {s.name for s in tilegemm.kernels("cuda")} >= {"naive", "register2d", "mma"}


# shared: loops (a back edge); register2d: a long unrolled block among loops.
@pytest.mark.parametrize("name", ["shared", "register2d"])
def test_liveness_on_bit_sets_gives_numba_cudas_sets(name: str, monkeypatch) -> None:
    """The variables live at each block's entry, computed on bit sets, are numba-cuda's
    own on every call a compile makes (3.2 of 10 s compiling pipelined before)."""
    from numba.cuda import compile_ptx
    from numba.cuda.core import analysis, ir_utils

    _numba_compile.install()
    original = analysis._tilegemm_original_compute_live_map
    compared: list[int] = []

    def both(cfg, blocks, uses, defs):  # noqa: ANN001, ANN202
        expected = original(cfg, blocks, uses, defs)
        got = _numba_compile.live_map(cfg, blocks, uses, defs)
        assert got == expected
        compared.append(sum(len(names) for names in expected.values()))
        return got

    monkeypatch.setattr(analysis, "compute_live_map", both)
    monkeypatch.setattr(ir_utils, "compute_live_map", both)
    spec = get(name, "cuda")
    program = spec.program(spec.defaults(), np.dtype("float32"))
    compile_ptx(program.kernel.py_func, program.signature("float32"), cc=ARCHS["sm_90"])
    assert len(compared) >= 3 and max(compared) > 50, compared


def test_liveness_on_bit_sets_follows_a_loop() -> None:
    """Around a loop: what the loop redefines and uses after it is live along the back
    edge; ``u``, used in the loop but defined nowhere a path reaches from the entry, is
    not live before the loop (numba's reading: no definition reaches there)."""
    from numba.cuda.core.controlflow import CFGraph

    _numba_compile.install()
    from numba.cuda.core import analysis

    cfg = CFGraph()
    for label in (0, 1, 2, 3):
        cfg.add_node(label)
    for edge in ((0, 1), (1, 2), (2, 1), (1, 3)):
        cfg.add_edge(*edge)
    cfg.set_entry_point(0)
    cfg.process()
    uses = {0: {"a"}, 1: {"i"}, 2: {"i", "x", "u"}, 3: {"x"}}
    defs = {0: {"i", "x", "t"}, 1: set(), 2: {"i", "x"}, 3: set()}
    expected = {0: {"a"}, 1: {"i", "x", "u"}, 2: {"i", "x", "u"}, 3: {"x"}}
    blocks = dict.fromkeys(uses)
    assert analysis._tilegemm_original_compute_live_map(cfg, blocks, uses, defs) == expected
    assert _numba_compile.live_map(cfg, blocks, uses, defs) == expected
