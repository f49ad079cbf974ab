"""``tilegemm explain --sass``: the machine code of CUDA rungs, counted (no GPU needed).

The counts are deterministic for a given compiler and disassembler, so the guard on the
fastest rungs' FFMA share is exact, and skipped when the toolchain differs from the one the
figures were taken with (a new ptxas schedules differently; re-measure and update then).
"""

from __future__ import annotations

import json

import pytest

from tilegemm import cli
from tilegemm.analysis import sass
from tilegemm.errors import UnavailableError
from tilegemm.registry import get

# A tiny hand-written kernel: set-up, an outer loop (k-tile) with a vector/scalar diamond,
# an inner loop (k step) of 2 FFMA + 1 LDS + 1 IADD3 + 1 branch, then the exit.
SYNTHETIC = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   ISETP.GE.AND P0, PT, R2, R3, PT ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
        /*0030*/                   LDG.E.128.CONSTANT R4, [R6.64] ;
        /*0040*/                   BRA `(.L_x_2) ;
.L_x_1:
        /*0050*/                   LDG.E R4, [R6.64] ;
        /*0060*/                   IADD3 R6, R6, 0x4, RZ ;
.L_x_2:
        /*0070*/                   STS.128 [R8], R4 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_3:
        /*0090*/                   LDS.128 R12, [R9] ;
        /*00a0*/                   FFMA R20, R12, R13, R20 ;
        /*00b0*/                   FFMA R21, R14, R15, R21 ;
        /*00c0*/                   IADD3 R9, R9, 0x10, RZ ;
        /*00d0*/               @P1 BRA `(.L_x_3) ;
        /*00e0*/                   IADD3 R2, R2, 0x8, RZ ;
        /*00f0*/               @P2 BRA `(.L_x_0) ;
        /*0100*/                   EXIT ;
.L_x_4:
        /*0110*/                   BRA `(.L_x_4) ;
"""


def test_synthetic_loops_paths_and_classes() -> None:
    r = sass.analyse(SYNTHETIC, kernel="toy", source="test", arch="sm_90", dtype="float32",
                     params={}, fma_per_kstep=2, bk=4)
    assert r.hot_range == (0x90, 0xd0)
    assert r.hot.total == 5 and r.hot.get("fma") == 2 and r.hot.lds_bytes == 16
    assert r.hot_ksteps == 1
    # k-tile: the 128-bit path (more global bytes than the scalar one), the inner loop 4 times.
    assert r.tile_ksteps == 4
    assert dict(r.tile.ldg_widths) == {16: 1}
    # head (ISETP, BRA), 128-bit side (LDG, BRA), STS+BAR, 4 k steps, latch (IADD3, BRA)
    assert r.tile.total == 2 + 2 + 2 + 4 * 5 + 2
    d = r.as_dict()
    assert d["hot_loop"]["fma_share"] == pytest.approx(2 / 5)
    assert d["hot_loop"]["fma_per_shared_byte"] == pytest.approx(2 / 16)
    assert d["k_tile"]["per_kstep"]["total"] == pytest.approx(28 / 4)
    # The self-loop after EXIT (padding trap) holds no FFMA and is not the hot loop.
    assert any("// FFMA" in line for line in r.hot_lines)
    # No checked vector path besides the interior one: an edge block's k-tile is the same.
    assert r.edge == r.tile


# A k-tile with an interior branch (the 128-bit load unchecked), an edge branch (a bounds
# check, then the same load) and the edge's scalar fallback, as rung 9 stages a tile.
EDGES = """
.L_x_0:
        /*0000*/                   ISETP.GE.AND P0, PT, R2, R3, PT ;
        /*0010*/               @P0 BRA `(.L_x_1) ;
        /*0020*/                   LDG.E.128.CONSTANT R4, [R6.64] ;
        /*0030*/                   BRA `(.L_x_3) ;
.L_x_1:
        /*0040*/                   ISETP.GE.AND P1, PT, R10, R11, PT ;
        /*0050*/                   IADD3 R12, R10, 0x4, RZ ;
        /*0060*/               @P1 BRA `(.L_x_2) ;
        /*0070*/                   LDG.E.128.CONSTANT R4, [R6.64] ;
        /*0080*/                   BRA `(.L_x_3) ;
.L_x_2:
        /*0090*/                   LDG.E R4, [R6.64] ;
.L_x_3:
        /*00a0*/                   STS.128 [R8], R4 ;
        /*00b0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00c0*/                   FFMA R20, R12, R13, R20 ;
        /*00d0*/                   FFMA R21, R14, R15, R21 ;
        /*00e0*/                   IADD3 R2, R2, 0x8, RZ ;
        /*00f0*/               @P2 BRA `(.L_x_0) ;
        /*0100*/                   EXIT ;
"""


def test_an_edge_blocks_k_tile_takes_the_checked_vector_path() -> None:
    """The k-tile row counts the interior branch (fewest instructions); the edge row the
    longest path that still loads 128 bits (the bounds check, then the load), never the
    scalar fallback."""
    r = sass.analyse(EDGES, kernel="toy", source="test", arch="sm_90", dtype="float32",
                     params={}, fma_per_kstep=2, bk=1)
    assert r.tile.total == 10 and r.edge.total == 13
    for path in (r.tile, r.edge):
        assert dict(path.ldg_widths) == {16: 1} and path.get("fma") == 2
    assert r.edge.get("int") == r.tile.get("int") + 2  # ISETP and IADD3 of the check
    d = r.as_dict()
    assert d["k_tile_edge"]["fma_share"] == pytest.approx(2 / 13)


# An if/else inside a BSSY/BSYNC region (divergent code): BSSY names the reconvergence
# point, which is no jump; each real path holds one arm (2 IADD3) and the BSYNC.
DIVERGENT = """
.L_x_0:
        /*0000*/                   FFMA R1, R2, R3, R1 ;
        /*0010*/                   BSSY B0, `(.L_x_2) ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
        /*0030*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0040*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0050*/                   BRA `(.L_x_3) ;
.L_x_1:
        /*0060*/                   IADD3 R4, R4, 0x2, RZ ;
        /*0070*/                   IADD3 R5, R5, 0x2, RZ ;
.L_x_3:
        /*0080*/                   BSYNC B0 ;
.L_x_2:
        /*0090*/               @P1 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
"""


def test_a_reconvergence_label_is_not_a_path() -> None:
    """The path finder took BSSY's label for a branch and counted a path of 4 instructions
    that skipped both arms and the BSYNC."""
    instrs = sass.parse_sass(DIVERGENT)
    loop = sass.find_loops(instrs)[0]
    path = sass.best_path(instrs, loop, {})
    assert path.total in (7, 8) and dict(path.counts).get("int") == 2, path.counts


@pytest.mark.parametrize(("op", "mods", "cls"), [
    ("FFMA", "", "fma"), ("DFMA", "", "fma"), ("LDS", ".U.128", "lds"), ("LDG", ".E.128", "ldg"),
    ("STS", ".128", "sts"), ("BAR", ".SYNC", "bar"), ("IMAD", ".MOV.U32", "move"),
    ("IMAD", ".WIDE", "int"), ("LEA", "", "int"), ("ULDC", ".64", "move"),
    ("BRA", "", "branch"), ("LDL", ".64", "local"), ("STL", "", "local"),
])
def test_classes(op: str, mods: str, cls: str) -> None:
    assert sass.classify(op, mods) == cls


def _nvdisasm_or_skip() -> None:
    try:
        sass.nvdisasm_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))


# The toolchain the guard's figures were measured with, and the figures (sm_90, float32
# defaults): rungs 6-9, whose k steps are written out. vectorized (rung 6) reads A one
# element per row per k step (8 scalar LDS next to 64 FFMA), hence its lower ceiling; it
# was 69 % (k-tile) before its k steps were written out.
GUARD_TOOLCHAIN = {"nvdisasm": "13.5.37", "nvvm": "13.5.37"}
GUARD = {"vectorized": (0.83, 0.83), "smem_layout": (0.90, 0.90), "warptile": (0.90, 0.90),
         "pipelined": (0.88, 0.88)}  # (hot loop, k-tile), at least


@pytest.mark.ptx
@pytest.mark.parametrize("name", list(GUARD))
def test_fastest_rung_ffma_share_does_not_regress(name: str) -> None:
    _nvdisasm_or_skip()
    if sass.toolchain() != GUARD_TOOLCHAIN:
        pytest.skip(f"toolchain {sass.toolchain()} differs from {GUARD_TOOLCHAIN}, "
                    "for which the figures were measured")
    r = sass.sass_report(get(name, "cuda"), None, "float32", "sm_90")
    hot, tile = GUARD[name]
    assert r.share(r.hot) >= hot
    assert r.share(r.tile) >= tile
    assert r.local_memory == 0
    assert r.hot.lds_bytes > 0 and r.tile.get("bar") > 0


@pytest.mark.ptx
def test_cli_json_and_table(capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    _nvdisasm_or_skip()
    monkeypatch.setenv("COLUMNS", "200")  # the table unfolded, whatever the shell's width
    assert cli.main(["explain", "pipelined", "--sass", "--json", "--hot-loop"]) == 0
    out = json.loads(capsys.readouterr().out)
    k = out["kernels"][0]
    assert k["kernel"] == "pipelined" and k["arch"] == "sm_90"
    assert k["fma_per_kstep"] == 64
    assert k["hot_loop"]["per_kstep"]["fma"] == 64
    assert any("FFMA" in line for line in k["hot_loop_sass"])
    # an edge block's k-tile: the same FFMAs and 128-bit loads, bounds checks around them
    edge, tile = k["k_tile_edge"]["per_kstep"], k["k_tile"]["per_kstep"]
    assert edge["fma"] == tile["fma"] and edge["ldg"] == tile["ldg"]
    assert edge["total"] > tile["total"] and edge["int"] > tile["int"]
    assert cli.main(["explain", "pipelined", "--sass"]) == 0
    out = capsys.readouterr().out
    assert "FFMA share" in out and "edge k-tile" in out


def test_a_rung_named_twice_is_counted_once() -> None:
    """'register2d,register2d' gave two identical entries; 'register2d,' an unknown ''."""
    import argparse

    from tilegemm.commands._sass import _specs

    for text in ("register2d,register2d", "register2d,", " register2d , ,"):
        specs = _specs(argparse.Namespace(kernel=text, backend="cuda", yardstick=False))
        assert [s.name for s in specs] == ["register2d"], text


def test_cli_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "warptile", "--sass", "--arch", "sm_70"]) == 2
    err = capsys.readouterr().err
    assert "sm_70" in err and "sm_80" in err and "sm_90" in err
    assert cli.main(["explain", "naive", "--sass"]) == 2
    err = capsys.readouterr().err
    assert "BM" in err and "register2d" in err and "warptile" in err  # what --sass takes


def test_missing_nvdisasm_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sass, "nvdisasm_path", _missing)
    assert cli.main(["explain", "warptile", "--sass"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nvdisasm" in err and "\n" not in err


def _missing() -> str:
    raise UnavailableError("nvdisasm is missing: pip install nvidia-cuda-nvdisasm")


# Rung mma (tensor cores), sm_90, defaults: the HMMA share of its hot loop (the interior
# k-tile loop: k steps written out, unchecked copies, TF32 rounded and 3xTF32 split once
# in shared memory).
# Before that work (docs/tensor-cores.md, "Machine code"): 4.5 % (tf32), 17 % (3xtf32, a
# k-step loop without the copies), 5.2 % (float16), 4.8 % (bfloat16).
# The 4-stage ring in dynamic shared memory took float16/bfloat16 from 34 % to 44.4/45.1 %
# (tf32 20.5 -> 19.5 %); then 3xTF32 split once in shared memory and a power-of-two ring
# wrapped by a mask: tf32 20.9 %, 3xtf32 22.6 -> 29.1 %; then 3xTF32's partial sums added
# in float32 per k step (accuracy: the tensor core truncates its sums): 29.1 -> 20.9 %.
MMA_GUARD = {("float32", 1): 0.20, ("float32", 3): 0.20, ("float16", 1): 0.43,
             ("bfloat16", 1): 0.44}


@pytest.mark.ptx
@pytest.mark.parametrize(("dtype", "passes"), list(MMA_GUARD))
def test_tensor_core_rung_hmma_share_does_not_regress(dtype: str, passes: int) -> None:
    _nvdisasm_or_skip()
    if sass.toolchain() != GUARD_TOOLCHAIN:
        pytest.skip(f"toolchain {sass.toolchain()} differs from {GUARD_TOOLCHAIN}, "
                    "for which the figures were measured")
    from tilegemm.analysis.sass_mma import mma_report

    spec = get("mma", "cuda")
    r = mma_report(spec, {"PASSES": passes} if dtype == "float32" else None, dtype, "sm_90")
    assert r.hmma_share >= MMA_GUARD[(dtype, passes)], r.hot
    assert r.local_memory == 0
    # the interior loop: 4 copies (16 bytes each) a thread per k-tile at the defaults
    assert r.hot["LDGSTS"] > 0 and r.hot["BAR"] > 0


@pytest.mark.ptx
def test_cli_lists_a_tensor_core_hot_loop(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``explain mma --sass --hot-loop``: the loop counted, listed line by line."""
    _nvdisasm_or_skip()
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["explain", "mma", "--sass", "--dtype", "float16", "--hot-loop"]
    assert cli.main([*argv, "--json"]) == 0
    [k] = json.loads(capsys.readouterr().out)["kernels"]
    lines = k["hot_loop_sass"]
    assert len(lines) == k["hot_loop"]["total"]
    assert sum(line.endswith("// HMMA") for line in lines) == k["hot_loop"]["HMMA"] > 0
    assert sum(line.endswith("// LDSM") for line in lines) == k["hot_loop"]["LDSM"] > 0
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "mma: hot loop" in out and "HMMA.16816.F32" in out


@pytest.mark.ptx
def test_rounded_copies_take_the_rounding_out_of_the_hot_loop() -> None:
    """Rung mma's TF32 with RCOPY=1 (A and B rounded by copies made before the kernel):
    on sm_90, 110 instructions a k-tile against 153 rounding in shared memory, HMMA
    20.9 % -> 29.1 % (measured with the guard's toolchain)."""
    _nvdisasm_or_skip()
    if sass.toolchain() != GUARD_TOOLCHAIN:
        pytest.skip(f"toolchain {sass.toolchain()} differs from {GUARD_TOOLCHAIN}, "
                    "for which the figures were measured")
    from tilegemm.analysis.sass_mma import mma_report

    r = mma_report(get("mma", "cuda"), {"PASSES": 1, "RCOPY": 1}, "float32", "sm_90")
    assert r.hmma_share >= 0.28 and r.hot["total"] <= 115, r.hot
    assert r.local_memory == 0 and r.hot["LDGSTS"] > 0


# One tensor-core loop: an ldmatrix.x4 (16 bytes a thread), a 32-bit shared load, a 16-byte
# cp.async copy, a TF32 m16n8k8 mma (1024 multiply-adds a warp, 32 a thread), a branch back.
SYNTHETIC_MMA = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0020*/                   LDS R8, [R3] ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64] ;
        /*0040*/                   HMMA.1688.F32.TF32 R10, R4, R8, R10 ;
        /*0050*/               @P0 BRA `(.L_x_0) ;
        /*0060*/                   EXIT ;
"""


def test_tensor_core_loop_counts_multiply_adds_per_shared_byte() -> None:
    from tilegemm.analysis.sass_mma import count, macs, shared_bytes

    r = count(SYNTHETIC_MMA, kernel="toy", arch="sm_90", dtype="float32", params={})
    assert r.hot["HMMA"] == 1 and r.hot["total"] == 5
    assert (r.hot_macs, r.hot_shared_bytes) == (32, 16 + 4 + 16)
    assert r.macs_per_shared_byte == pytest.approx(32 / 36)
    assert r.as_dict()["macs_per_shared_byte"] == pytest.approx(32 / 36)
    # the listing: the loop's five instructions, each named by its kind (or class)
    assert [line.rsplit("// ", 1)[1] for line in r.hot_lines] == [
        "LDSM", "LDS", "LDGSTS", "HMMA", "branches/control"]
    assert "HMMA.1688.F32.TF32" in r.hot_lines[3] and r.hot_lines[0].startswith("/*0010*/")
    line = "        /*0000*/                   {} ;\n"

    def one(text: str) -> sass.Instr:
        [ins] = sass.parse_sass(line.format(text))
        return ins

    assert macs(one("HMMA.16816.F32.BF16 R10, R4, R8, R10")) == 64
    assert macs(one("HGMMA.64x128x8.F32.TF32 R24, gdesc[UR4], R24")) == 0
    assert shared_bytes(one("LDSM.16.MT88.2 R4, [R2]")) == 8
    assert shared_bytes(one("LDSM.16.M88 R4, [R2]")) == 4
    assert shared_bytes(one("LDS.64 R4, [R2]")) == 8
    assert shared_bytes(one("STS.128 [R2], R4")) == 16
    assert shared_bytes(one("LDGSTS.E [R5], desc[UR4][R6.64]")) == 4
    assert shared_bytes(one("IADD3 R6, R6, 0x4, RZ")) == 0
