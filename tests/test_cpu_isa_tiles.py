"""The CPU ``blocked`` rung on 64-bit ARM (NEON), checked on any host.

On an aarch64 CPU the rung's register tile must fit NEON's 32 registers of 128 bits. The
tests here check what makes that so without an ARM machine: the ISA is detected from the
features and architecture Numba compiles for; the code is built in 128-bit vectors there;
the database gives NEON hosts their own tiles; those tiles' K loop, compiled to AArch64
machine code through LLVM's AArch64 back end (part of llvmlite), keeps every accumulator
in a register; and the rung built that way computes the product (run on this host).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tilegemm.backends import get_backend
from tilegemm.backends.base import Limits, Target
from tilegemm.tune import database, select

TRIPLE = "aarch64-unknown-linux-gnu"
# Cores a user is likely to run: AWS Graviton2 and Ampere Altra (Neoverse N1), Graviton3
# (Neoverse V1, with SVE), Apple's M1.
ARM_CPUS = ("neoverse-n1", "neoverse-v1", "apple-m1")


def _arm_target(name: str = "Neoverse-N1") -> Target:
    return Target("cpu", name, "cpu", "aarch64", Limits(threads_per_block=0), "perf_counter")


@pytest.mark.parametrize(("features", "arch", "expected"), [
    ("+neon,+fp-armv8,+crc,+lse,+rdm,+dotprod,+rcpc", "aarch64", "neon"),  # Graviton2
    ("+neon,+fp-armv8,+sve,+sve2,+bf16,+i8mm", "aarch64", "neon"),  # SVE: still 128-bit NEON
    ("", "arm64", "neon"),  # Apple's systems: triple "arm64-apple-darwin", features may be empty
    ("-neon,+fp-armv8", "aarch64", "generic"),  # NEON turned off (NUMBA_CPU_FEATURES)
    ("+neon", "armv7l", "generic"),  # 32-bit ARM: not the aarch64 register file
    ("+neon", "x86_64", "generic"),  # code for x86 follows x86's features alone
    ("+avx,+avx2,+fma,-avx512f", "x86_64", "avx2"),
    ("+avx,+avx2,+fma,+avx512f", "x86_64", "avx512"),
    ("", "x86_64", "generic"),
])
def test_isa_follows_features_and_architecture(features, arch, expected):
    assert database.isa_of(database.parse_features(features), arch) == expected


def test_host_isa_reads_the_architecture_numba_compiles_for(monkeypatch):
    """``host_isa`` combines the features Numba compiles for with the architecture of the
    process's target triple, which is x86_64 here and stands in for an ARM one."""
    from llvmlite import binding as llvm
    from numba.core import config

    assert database.compiled_arch() == llvm.get_process_triple().split("-")[0]
    monkeypatch.setattr(config, "CPU_FEATURES", "+neon,+fp-armv8")
    for arch, expected in (("aarch64", "neon"), ("x86_64", "generic")):
        monkeypatch.setattr(database, "compiled_arch", lambda arch=arch: arch)
        database.host_isa.cache_clear()
        try:
            assert database.host_isa() == expected
        finally:
            database.host_isa.cache_clear()


def test_neon_code_uses_128_bit_vectors(monkeypatch):
    """On NEON the K loop's vectors are 128 bits (4 float32, 2 float64): one register each,
    so the register arithmetic of the tile is exact."""
    from tilegemm.kernels.cpu._vector_tile import lanes
    from tilegemm.kernels.cpu.k02_blocked import vector_bits

    monkeypatch.setattr(database, "host_isa", lambda: "neon")
    assert vector_bits() == 128
    assert lanes(8, np.dtype("float32"), vector_bits()) == 4
    assert lanes(8, np.dtype("float64"), vector_bits()) == 2
    monkeypatch.setattr(database, "host_isa", lambda: "avx2")
    assert vector_bits() is None  # x86 without AVX-512: LLVM's choice, as before


@pytest.mark.parametrize(("dtype", "tile"), [("float32", (12, 8)), ("float64", (6, 8))])
def test_neon_host_gets_the_neon_entries(dtype, tile, monkeypatch):
    """A NEON host with no entry of its own gets the NEON ISA defaults, as full parameters
    that the rung accepts (its other blocks at the rung's defaults)."""
    monkeypatch.setattr(database, "host_isa", lambda: "neon")
    monkeypatch.setattr(database, "host_family_model", lambda: "")  # ARM's cpuinfo has none
    entry, tier = database.lookup(_arm_target(), dtype)
    assert (entry["isa"], entry["device"], tier) == ("neon", "*", "isa")
    assert (entry["params"]["MR"], entry["params"]["NR"]) == tile
    assert "not timed on ARM" in entry["measured"]
    spec, params = select.untuned_choice(get_backend("cpu"), dtype, _arm_target())
    defaults = spec.defaults()
    assert (spec.name, params["MR"], params["NR"]) == ("blocked", *tile)
    assert {k: params[k] for k in ("MC", "KC", "NC")} == {
        k: defaults[k] for k in ("MC", "KC", "NC")}


@pytest.mark.parametrize(("isa", "dtype", "tile"), [
    ("avx512", "int32", (8, 32)), ("avx512", "int64", (8, 16)), ("avx2", "int32", (4, 16)),
    ("avx2", "int64", (8, 8))])
def test_x86_host_gets_the_integer_isa_entries(isa, dtype, tile, monkeypatch):
    """An x86 CPU with no entry of its own gets the integer tiles of its ISA: on AVX-512
    the float tile of the same element size (the rung default 16×8 fills only 256-bit
    vectors in int32), on AVX2 4×16 int32 and 8×8 int64 (no 64-bit vector multiply: the
    rung default 16×8 only spills more, the slowest tile on an AMD Zen 3)."""
    x86 = Target("cpu", "Some x86 CPU", "cpu", "x86_64", Limits(threads_per_block=0),
                 "perf_counter")
    monkeypatch.setattr(database, "host_isa", lambda: isa)
    monkeypatch.setattr(database, "host_family_model", lambda: "6-999")
    found = database.lookup(x86, dtype)
    spec, params = select.untuned_choice(get_backend("cpu"), dtype, x86)
    entry, tier = found
    assert (entry["isa"], entry["device"], tier) == (isa, "*", "isa")
    assert entry["source"].startswith("benchmarks/results/cpu-int-tiles-")
    assert (params["MR"], params["NR"]) == tile
    assert spec.is_valid(params) and spec.dtype_check(params, np.dtype(dtype)) is None


def _aarch64_loop(mr: int, nr: int, dtype: str, cpu: str, op: str) -> tuple[list[str], int]:
    """The rung's vector K loop for an MR×NR tile, built as on a NEON host and compiled to
    AArch64 machine code for ``cpu``: (the ``op`` instructions, stack accesses) in its
    busiest block (the one with the most ``op``)."""
    from llvmlite import binding as llvm

    from tilegemm.kernels.cpu._slp import with_vector_width
    from tilegemm.kernels.cpu._vector_tile import module_ir
    from tilegemm.kernels.cpu.k02_blocked import ISA_VECTOR_BITS, K_UNROLL

    bits = ISA_VECTOR_BITS["neon"]
    text = with_vector_width(module_ir(mr, nr, np.dtype(dtype), bits, K_UNROLL, TRIPLE), bits)
    module = llvm.parse_assembly(text)
    module.verify()
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(
        cpu=cpu, features="+neon", opt=3)
    asm = machine.emit_assembly(module)
    blocks = re.split(r"\n(?=\.?[\w$.]+:)", asm)

    def ops(block: str) -> list[str]:
        return [ln for ln in block.splitlines() if ln.split() and ln.split()[0] == op]

    loop = max(blocks, key=lambda b: len(ops(b)))
    # ldr/str/ldp/stp against the stack pointer (or the frame pointer, x29)
    return ops(loop), len(re.findall(r"\[(?:sp|x29)\b", loop))


def _aarch64_k_loop(mr: int, nr: int, dtype: str, cpu: str) -> tuple[int, int]:
    """(vector FMAs, stack accesses) in the busiest block of the float K loop."""
    fmas, stack = _aarch64_loop(mr, nr, dtype, cpu, "fmla")
    # 128-bit FMAs only: v.4s (float32) or v.2d (float64), by vector or by element
    arrangement = ".4s" if dtype == "float32" else ".2d"
    assert all(arrangement in ln for ln in fmas), fmas[:4]
    return len(fmas), stack


@pytest.fixture(scope="module")
def aarch64() -> None:
    """Skip where this llvmlite was built without LLVM's AArch64 back end."""
    from llvmlite import binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        llvm.Target.from_triple(TRIPLE)
    except RuntimeError as exc:
        pytest.skip(f"llvmlite has no AArch64 target: {exc}")


@pytest.mark.parametrize("cpu", ARM_CPUS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_neon_defaults_keep_the_tile_in_registers(aarch64, dtype, cpu, monkeypatch):
    """The NEON ISA defaults hold 24 accumulators (12×8 float32: 12 rows × 2 vectors; 6×8
    float64: 6 × 4) with B's vectors and A's values beside them in 32 registers: the
    compiled K loop has its K_UNROLL steps of MR·NR/lanes FMAs and no stack access."""
    from tilegemm.kernels.cpu.k02_blocked import K_UNROLL

    monkeypatch.setattr(database, "host_isa", lambda: "neon")
    monkeypatch.setattr(database, "host_family_model", lambda: "")
    entry, _ = database.lookup(_arm_target(), dtype)
    mr, nr = entry["params"]["MR"], entry["params"]["NR"]
    per_vector = 16 // np.dtype(dtype).itemsize
    assert mr * nr // per_vector == 24  # the register budget the entries were chosen for
    assert _aarch64_k_loop(mr, nr, dtype, cpu) == (K_UNROLL * mr * nr // per_vector, 0)


@pytest.mark.parametrize("cpu", ARM_CPUS)
def test_too_large_neon_tile_spills(aarch64, cpu):
    """Negative control: the rung's default 16×8 float32 tile needs 32 accumulators, all of
    NEON's registers before any of B, so the same count must see its spills."""
    from tilegemm.kernels.cpu.k02_blocked import K_UNROLL

    fmas, stack = _aarch64_k_loop(16, 8, "float32", cpu)
    assert fmas == K_UNROLL * 32 and stack > 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_neon_tiles_in_128_bit_vectors_compute_the_product(dtype, monkeypatch):
    """The whole rung, built as on a NEON host (its ISA defaults, 128-bit vectors in the
    K loop), run here on x86: the 4- and 2-lane loop with 2 or 4 vectors a row must give
    the product on shapes with partial tiles on every edge, a K remainder and alpha/beta.
    The rung is built directly, not through the per-process program cache, whose key does
    not hold the vector width. The float64 rung's first compile is spread over two worker
    processes (``_compile_workers``), which must build the same rung: the 128-bit vectors
    included, which this process hands them (float32's compiles here, as the suite's
    others do: the workers' start costs CPU time the other tests use)."""
    from tilegemm import compile_cache
    from tilegemm.kernels.cpu import k02_blocked
    from tilegemm.reference import assert_close, random_operands
    from tilegemm.registry import get

    monkeypatch.setattr(database, "host_isa", lambda: "neon")
    monkeypatch.setattr(database, "host_family_model", lambda: "")
    monkeypatch.setenv("TILEGEMM_COMPILE_JOBS", "2" if dtype == "float64" else "1")
    entry, _ = database.lookup(_arm_target(), dtype)
    params = get("blocked", "cpu").resolve(entry["params"])
    compiled_before = compile_cache.STATS["compiled"]
    program = k02_blocked.build(params, np.dtype(dtype))
    if dtype == "float64":  # here at most the probe, which finds the cache empty
        assert compile_cache.STATS["compiled"] - compiled_before <= 1
    assert program.__globals__["VECTOR_BITS"] == 128  # the constant the K loop is built from
    rng = np.random.default_rng(5)
    a, b = random_operands((2, 101, 67), (67, 75), dtype, seed=5)
    c = rng.uniform(-1, 1, size=(2, 101, 75)).astype(dtype)
    out = c.copy()
    program(a, b[None], out, np.dtype(dtype).type(0.75), np.dtype(dtype).type(-0.5))
    assert_close(out, a, b, alpha=0.75, beta=-0.5, c=c, what=f"NEON tile {params}")


# /proc/cpuinfo's first block on a Graviton2 (64-bit ARM Linux has no "model name").
GRAVITON2 = {"processor": "0", "bogomips": "243.75", "features": "fp asimd evtstrm aes crc32",
             "cpu implementer": "0x41", "cpu architecture": "8", "cpu variant": "0x3",
             "cpu part": "0xd0c", "cpu revision": "1"}


@pytest.mark.parametrize(("fields", "name", "family_model"), [
    (GRAVITON2, "ARM Neoverse-N1", "0x41-0xd0c"),
    ({**GRAVITON2, "cpu part": "0xd4f"}, "ARM Neoverse-V2", "0x41-0xd4f"),
    # A core not in the table is still told apart from the others, by its numbers.
    ({**GRAVITON2, "cpu implementer": "0x61", "cpu part": "0x023"},
     "ARM CPU (implementer 0x61, part 0x023)", "0x61-0x023"),
    ({"cpu family": "26", "model": "2", "model name": "AMD EPYC"}, "AMD EPYC", "26-2"),
])
def test_cpu_name_tells_arm_cores_apart(monkeypatch, fields, name, family_model):
    """The device name in the tuning cache and the database must differ between ARM cores:
    without the implementer/part numbers every ARM Linux machine would be "aarch64"."""
    from tilegemm.backends import cpu

    monkeypatch.setattr(cpu, "_cpuinfo", lambda: fields)
    assert cpu.cpu_name() == name
    assert cpu.cpu_family_model() == family_model
    # A database entry naming the vendor ("0x41") or the core matches the ARM host.
    rank = database._cpu_rank({"cpu": family_model.split("-")[0]}, family_model)
    assert rank == 1
    assert database._cpu_rank({"cpu": family_model}, family_model) == 2


@pytest.mark.parametrize("cpu", ARM_CPUS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_neon_integer_entries_keep_the_tile_in_registers(aarch64, dtype, cpu, monkeypatch):
    """The NEON integer entries, chosen from the machine code like the float ones: 12×8
    int32 is 24 accumulators of vector multiply-accumulates (``mla``, 4 lanes). NEON has no
    64-bit vector multiply, so int64 multiplies in general registers (``mul``), or, where
    the CPU has SVE (Neoverse V1), with SVE's 2-lane ``mla``; 4×8 keeps to the registers
    either way. Negative control: the rung default 16×8 goes through the stack in both."""
    from tilegemm.kernels.cpu.k02_blocked import K_UNROLL

    monkeypatch.setattr(database, "host_isa", lambda: "neon")
    monkeypatch.setattr(database, "host_family_model", lambda: "")
    entry, tier = database.lookup(_arm_target(), dtype)
    assert (entry["device"], tier) == ("*", "isa") and "not timed on ARM" in entry["measured"]
    mr, nr = entry["params"]["MR"], entry["params"]["NR"]
    lanes = 4 if dtype == "int32" else 2
    vector, stack = _aarch64_loop(mr, nr, dtype, cpu, "mla")
    if dtype == "int64" and not vector:  # no SVE: one general-register multiply per element
        scalar, stack = _aarch64_loop(mr, nr, dtype, cpu, "mul")
        assert len(scalar) == K_UNROLL * mr * nr
    else:
        assert len(vector) == K_UNROLL * mr * nr // lanes
    assert stack == 0
    assert _aarch64_loop(16, 8, dtype, cpu, "mla" if vector else "mul")[1] > 0
