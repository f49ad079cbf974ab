"""Device functions inlined by NVVM (rungs mma and wgmma: the checked loader, the epilogue's
store) are compiled by numba as subroutines, which numba keeps per process keyed by their
code, not their globals. A loader generated for one tile shape must not be reused by the
next kernel of another shape: on an H100 that gave wrong products and illegal addresses
whenever one process built two shapes (found by the GPU test run on 2026-11-26)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.ptx

FILL = """
@cuda.jit(device=True, inline=True)
def fill(out, i):
    out[i] = VALUE
"""


def _kernel_ptx(value: float) -> str:
    """PTX of a kernel whose NVVM-inlined device function stores the global VALUE."""
    from numba import cuda, float32

    from tilegemm.kernels.cuda._codegen import compile_source
    from tilegemm.kernels.cuda.k10_mma import nvvm_inlined

    fill = nvvm_inlined(compile_source(FILL, "fill", {"cuda": cuda,
                                                      "VALUE": np.float32(value)}))
    kernel: Any = compile_source("def k(out):\n    fill(out, 0)\n", "k", {"fill": fill})
    ptx, _ = cuda.compile_ptx(kernel, (float32[::1],), cc=(8, 0))
    return ptx


def _stored(ptx: str) -> set[float]:
    """The float32 constants the PTX moves into registers (as bits or as 0f... literals)."""
    bits = [int(x) for x in re.findall(r"mov\.[bu]32\s+%r\d+, (\d+);", ptx)]
    bits += [int(x, 16) for x in re.findall(r"0f([0-9A-F]{8})", ptx)]
    return {float(np.uint32(b).view(np.float32)) for b in bits}


def test_same_text_with_other_globals_is_compiled_again() -> None:
    first, second, again = _kernel_ptx(1.5), _kernel_ptx(2.5), _kernel_ptx(1.5)
    assert _stored(first) == {1.5}
    assert _stored(second) == {2.5}  # not the first kernel's 1.5
    assert _stored(again) == {1.5}


def _normalised(ptx: str) -> str:
    """PTX without what differs between processes: symbol names carry serial numbers."""
    ptx = re.sub(r"_Z[A-Za-z0-9_]+", "F", ptx)
    return re.sub(r"_cudapy_smem_\d+", "smem", ptx)


def _after_and_alone(name: str, first: dict[str, int], second: dict[str, int],
                     dtype: str, arch: str) -> tuple[str, str]:
    """The PTX of rung ``name`` at ``second`` compiled right after ``first`` in this
    process, and compiled with numba's subroutine cache emptied (as in a fresh process)."""
    from numba.cuda.descriptor import cuda_target

    from tilegemm import registry
    from tilegemm.analysis.resources import compile_ptx_all

    spec = registry.get(name, "cuda")
    registry._build.cache_clear()
    compile_ptx_all(spec, spec.resolve(first), dtype)
    after = compile_ptx_all(spec, spec.resolve(second), dtype)[arch]
    cuda_target.target_context.cached_internal_func.clear()
    registry._build.cache_clear()
    alone = compile_ptx_all(spec, spec.resolve(second), dtype)[arch]
    return _normalised(after), _normalised(alone)


@pytest.mark.slow  # ~10 s: six compiles
def test_a_tile_shape_compiled_after_another_is_the_same_code_as_alone() -> None:
    """Rung mma as the second kernel of the process reads its own shape's constants (the
    shapes of the H100 failure: the loader's thread count and rounds differ), and so does
    one whose swizzles differ too (BK and BN: the A and B chunk swizzles)."""
    base = {"BM": 32, "BN": 16, "BK": 16, "WM": 16, "WN": 16, "STAGES": 2, "GROUP_M": 2}
    after, alone = _after_and_alone("mma", {**base, "BN": 32, "WN": 32},
                                    {**base, "BN": 32, "WN": 16}, "float32", "sm_80")
    assert after == alone
    after, alone = _after_and_alone("mma", base, {**base, "BN": 64, "WN": 32, "BK": 32},
                                    "float16", "sm_80")
    assert after == alone


@pytest.mark.slow  # ~10 s: three compiles
def test_wgmma_shapes_compiled_one_after_another() -> None:
    """Rung wgmma's loader is an NVVM-inlined subroutine too (with a 4-stage ring)."""
    first = {"BM": 64, "BN": 32, "STAGES": 4, "GROUP_M": 2}
    after, alone = _after_and_alone("wgmma", first, {**first, "BM": 128, "BN": 64},
                                    "float32", "sm_90")
    assert after == alone


def test_the_rungs_subroutines_are_named_the_same_in_every_process() -> None:
    """The subroutine's name carries a hash of its globals, and the on-disk kernel cache's
    key describes it: a name of its own per process (the fallback for globals with no
    stable description) would make every new process miss the cache of rungs mma and
    wgmma. Their loaders and stores all have stable names."""
    from tilegemm.kernels.cuda import k10_mma

    names: list[str] = []
    keyed = k10_mma._keyed_by_globals

    def spy(fn: Any) -> Any:
        copy = keyed(fn)
        names.append(copy.__name__)
        return copy

    k10_mma._keyed_by_globals = spy
    try:
        from tilegemm import registry

        registry._build.cache_clear()  # built afresh, through the spy
        # wgmma's default ring (6 stages) keeps numba's inlining of its loader
        # (k10_mma.loader_call): only its store is NVVM-inlined; at 4 stages both are
        for rung, over in (("mma", {}), ("wgmma", {}), ("wgmma", {"STAGES": 4})):
            spec = registry.get(rung, "cuda")
            for dtype in ("float32", "float16"):
                spec.program(spec.resolve(over), np.dtype(dtype))
    finally:
        k10_mma._keyed_by_globals = keyed
    assert len(names) == 10, names  # a loader (but at 6 stages) and a store per program
    assert all(re.fullmatch(r"(load_stage|put)_[0-9a-f]{16}", n) for n in names), names
