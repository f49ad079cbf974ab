"""Every CUDA rung compiles to PTX and links to a cubin for sm_80 and sm_90 (no GPU needed).

nvJitLink's ptxas report is how we know a rung does what its docstring claims: the
register-tiled rungs keep their accumulators in registers (no local memory, no spills),
and the shared memory ptxas allocated is exactly what the spec declares, which is what the
backend checks against the 48 KB static limit before a launch (a rung with dynamic shared
memory, mma, declares none statically: its launch sizes it, up to the opt-in maximum).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import tilegemm
from tilegemm import cli
from tilegemm.analysis.resources import ARCHS, archs_for, cuda_resources, ptx_for
from tilegemm.backends.base import shared_limit
from tilegemm.backends.cuda import CUDA_LIMITS
from tilegemm.registry import KernelSpec, get

pytestmark = pytest.mark.ptx

SPECS = tilegemm.kernels("cuda")
# ptxas on sm_90 adds 1 KB of system-reserved shared memory to the figure it reports for a
# kernel that uses shared memory; the kernel's own allocation is the rest.
SM90_RESERVED_SMEM = 1024


def _arch_or_skip(spec: KernelSpec, arch: str) -> None:
    if arch not in archs_for(spec):  # architecture-specific instructions (wgmma: sm_90a)
        pytest.skip(f"{spec.name} compiles only for {', '.join(archs_for(spec))}")


def _declared_smem(spec: KernelSpec, dtype: str) -> int:
    assert spec.smem is not None, f"{spec.name} declares no smem()"
    return spec.smem(spec.defaults(), np.dtype(dtype).itemsize)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_rung_compiles_and_links(spec: KernelSpec, arch: str) -> None:
    _arch_or_skip(spec, arch)
    r = cuda_resources(spec, None, "float32", arch)
    assert r.registers > 0
    assert r.cubin_bytes > 0
    # a rung with dynamic shared memory (mma) declares none statically: the launch sizes it
    declared = 0 if spec.dynamic_smem else _declared_smem(spec, "float32")
    reserved = SM90_RESERVED_SMEM if arch == "sm_90" and (declared or spec.dynamic_smem) else 0
    assert r.smem == declared + reserved, f"{spec.name}: ptxas smem {r.smem}, spec {declared}"
    assert spec.threads is not None and spec.threads(spec.defaults()) <= 1024


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("name", ["register1d", "register2d"])
def test_register_tiles_stay_in_registers(name: str, arch: str) -> None:
    """float32 defaults: the local arrays are promoted to registers and nothing spills."""
    spec = get(name, "cuda")
    r = cuda_resources(spec, None, "float32", arch)
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    ptx = ptx_for(spec, spec.defaults(), "float32", arch)
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert r.smem - (SM90_RESERVED_SMEM if arch == "sm_90" else 0) == spec.smem(
        spec.defaults(), 4)


def _largest_block(spec: KernelSpec) -> dict[str, int]:
    """The most threads per block among the parameters the backend would launch."""
    limit, _ = shared_limit(spec, CUDA_LIMITS)  # the opt-in maximum for dynamic memory
    launchable = [p for p in spec.space() if spec.smem(p, 4) <= limit]
    return max(launchable, key=lambda p: (spec.threads(p), sorted(p.items())))


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_blocks_fit_the_register_file(spec: KernelSpec, arch: str) -> None:
    """A block's registers must fit an SM's 65,536, or the launch fails on a real GPU: the
    rungs are jitted with launch bounds (``.maxntid``) so ptxas fits them to the block."""
    _arch_or_skip(spec, arch)
    for params in (spec.defaults(), _largest_block(spec)):
        r = cuda_resources(spec, params, "float32", arch)
        threads = spec.threads(params)
        assert r.registers * threads <= 65_536, (spec.name, params, r.registers, threads)
        assert f".maxntid {threads}" in ptx_for(spec, params, "float32", arch).replace(
            ", 1, 1", "")


def test_cli_kernels_resources(capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps names in a narrow captured terminal
    assert cli.main(["kernels", "--backend", "cuda", "--resources"]) == 0
    out = capsys.readouterr().out
    for spec in SPECS:
        assert spec.name in out
    assert cli.main(["kernels", "--backend", "cuda", "--resources", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["kernel"], r["arch"]) for r in rows} == {
        (s.name, a) for s in SPECS for a in archs_for(s)}
    assert all(r["registers"] > 0 for r in rows)


@pytest.mark.ptx
@pytest.mark.parametrize("spec", tilegemm.kernels("cuda"), ids=lambda s: s.name)
def test_float32_kernels_do_no_float64_math(spec):
    """A stray Python float literal (0. instead of float32(0)) would promote the inner loop
    to double precision, which runs at 1/64 of the FP32 rate on consumer GPUs: none allowed."""
    ptx = ptx_for(spec, spec.resolve(), "float32", "sm_90")
    f64 = [line.strip() for line in ptx.splitlines() if ".f64" in line]
    assert not f64, f"{spec.name}: float64 instructions in float32 PTX: {f64[:3]}"


@pytest.mark.ptx
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize(
    ("name", "params"),
    [(s.name, p) for s in SPECS if s.name in ("naive", "coalesced", "shared")
     for p in s.space()],
    ids=lambda x: x if isinstance(x, str) else " ".join(f"{k}={v}" for k, v in x.items()),
)
def test_one_output_per_thread_rungs_never_spill(name: str, params: dict, arch: str) -> None:
    """Every block size of rungs 1-3, up to 1,024 threads (64 registers each under the launch
    bounds), compiles without local memory: seed 004's 32×32 configuration included."""
    r = cuda_resources(get(name, "cuda"), params, "float32", arch)
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
