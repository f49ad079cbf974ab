"""PTX and ptxas facts about the fast CUDA rungs, compiled for sm_80/sm_90 with no GPU.

- rung 6 really issues 128-bit accesses (``ld.global.v4.f32`` and shared ``v4``), which is
  the whole point of the rung and easy to lose silently (numba falls back to scalar code
  if the intrinsic is not used);
- every fast rung at its default parameters runs without local-memory spills and without
  a stack frame (the register arrays stay in registers), within the 255-register limit.
"""

from __future__ import annotations

import re

import pytest

from tilegemm import registry
from tilegemm.analysis.resources import cuda_resources, ptx_for

pytestmark = pytest.mark.ptx

RUNGS = ("vectorized", "smem_layout", "warptile", "pipelined")


def _spec(name: str) -> registry.KernelSpec:
    if not any(s.name == name for s in registry.specs_for("cuda")):
        pytest.skip(f"rung {name} not registered")
    return registry.get(name, "cuda")


def _count(ptx: str, op: str) -> int:
    return len(re.findall(rf"\t{re.escape(op)}\s", ptx))


def test_vectorized_issues_128_bit_accesses() -> None:
    spec = _spec("vectorized")
    ptx = ptx_for(spec, spec.defaults(), "float32", "sm_90")
    assert _count(ptx, "ld.global.v4.f32") >= 2  # A and B tiles
    assert _count(ptx, "st.shared.v4.f32") >= 2
    assert _count(ptx, "ld.shared.v4.f32") >= 1  # B in the inner loop
    assert _count(ptx, "st.global.v4.f32") >= 1  # C
    assert ".local" not in ptx


def test_vectorized_float64_uses_two_element_vectors() -> None:
    spec = _spec("vectorized")
    ptx = ptx_for(spec, {**spec.defaults(), "TM": 4, "TN": 4}, "float64", "sm_90")
    assert _count(ptx, "ld.global.v2.f64") >= 2


@pytest.mark.parametrize("name", RUNGS[1:])
def test_later_rungs_read_both_tiles_as_vectors(name: str) -> None:
    spec = _spec(name)
    ptx = ptx_for(spec, spec.defaults(), "float32", "sm_90")
    assert _count(ptx, "ld.global.v4.f32") >= 2  # edge blocks
    # Interior blocks read A and B through the read-only path (LDG.E.128.CONSTANT).
    assert _count(ptx, "ld.global.nc.v4.f32") >= 2
    assert _count(ptx, "ld.shared.v4.f32") >= 4  # A (transposed) and B, TM/4 + TN/4 each
    assert "ld.shared.f32" not in ptx  # no scalar shared reads left in the inner loop


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("name", RUNGS)
def test_no_spills_at_defaults(name: str, arch: str) -> None:
    spec = _spec(name)
    res = cuda_resources(spec, dtype="float32", arch=arch)
    assert res.spill_stores == 0 and res.spill_loads == 0, res
    assert res.stack == 0, res  # acc/ra/rb promoted to registers, no local arrays
    assert res.registers <= 255
    threads = spec.threads(res.params)
    assert res.registers * threads <= 65536, res  # at least one block fits on an SM
    assert res.smem >= spec.smem(res.params, 4)  # ptxas agrees with the declared size


# Register ceilings reached at the float32 defaults (docs/performance.md, "Registers"). At
# 256 threads a block, <= 128 registers lets two blocks share an SM's 65,536 registers;
# the rungs needed 150-188 before their loops were rewritten as while loops and their edge
# paths went through _access.load/store. A change that brings that back fails here.
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("name", RUNGS)
def test_float32_defaults_fit_two_blocks_per_sm(name: str, arch: str) -> None:
    spec = _spec(name)
    res = cuda_resources(spec, dtype="float32", arch=arch)
    threads = spec.threads(res.params)
    assert res.spills == 0 and res.stack == 0, res
    assert res.registers <= 128, res
    assert 2 * res.registers * threads <= 65536, res


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("name", RUNGS)
def test_float64_defaults_do_not_spill(name: str, arch: str) -> None:
    """float64 needs two registers per accumulator (128 for the 64 outputs alone), so one
    block per SM is the best it can do; it must still keep everything in registers."""
    spec = _spec(name)
    res = cuda_resources(spec, dtype="float64", arch=arch)
    assert res.spills == 0 and res.stack == 0, res
    assert res.registers * spec.threads(res.params) <= 65536, res
