"""The counting rules of ``tilegemm explain`` on hand-made access patterns (no simulator).

Each case is small enough to check by hand: which 32-byte sectors a warp touches, which
4-byte words fall in which of the 32 banks, how blocks are classed and weighted, and the
occupancy arithmetic of NVIDIA's occupancy calculator.
"""

from __future__ import annotations

import numpy as np
import pytest

from tilegemm.analysis.memory import GLOBAL, RECORD, SHARED, SiteInfo, count_block
from tilegemm.analysis.occupancy import occupancy
from tilegemm.analysis.roofline import GPUS, bound, get_gpu
from tilegemm.analysis.sampling import plan_blocks

INFOS = {0: SiteInfo(0, GLOBAL, False, "A", "k.py:1:1", "A[i]"),
         1: SiteInfo(1, SHARED, False, "s", "k.py:2:1", "s[i]")}


def records(rows: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    return np.array(rows, dtype=RECORD)


def warp_access(site: int, addr_of_lane, size: int = 4, instance: int = 0,
                lanes: range = range(32), warp: int = 0) -> list[tuple[int, int, int, int, int]]:
    return [(warp * 32 + lane, site, instance, addr_of_lane(lane), size) for lane in lanes]


@pytest.mark.parametrize("addr, sectors", [
    (lambda lane: 4 * lane, 4),              # 32 consecutive floats, aligned: 128 B = 4 sectors
    (lambda lane: 0, 1),                     # broadcast of one element
    (lambda lane: 16 + 4 * lane, 5),         # misaligned by half a sector: one more
    (lambda lane: 128 * lane, 32),           # a column of a 32-float row-major matrix
    (lambda lane: 8 * lane, 8),              # stride 2 floats: half of each sector wasted
])
def test_global_sectors_per_request(addr, sectors):
    c = count_block(records(warp_access(0, addr)), INFOS).sites[0]
    assert (c.requests, c.accesses, c.sectors) == (1, 32, sectors)


def test_requests_split_by_warp_and_instance():
    rows = (warp_access(0, lambda lane: 4 * lane, instance=0)
            + warp_access(0, lambda lane: 4 * lane + 128, instance=1)
            + warp_access(0, lambda lane: 4 * lane, warp=1))
    c = count_block(records(rows), INFOS).sites[0]
    assert (c.requests, c.sectors) == (3, 12)


def test_partial_warp_counts_active_lanes_only():
    c = count_block(records(warp_access(0, lambda lane: 4 * lane, lanes=range(5))), INFOS).sites[0]
    assert (c.requests, c.accesses, c.sectors) == (1, 5, 1)


@pytest.mark.parametrize("addr, size, waves, ideal, degree", [
    (lambda lane: 4 * lane, 4, 1, 1, 1),          # 32 banks, one word each
    (lambda lane: 0, 4, 1, 1, 1),                 # same word: broadcast
    (lambda lane: 128 * lane, 4, 32, 1, 32),      # column of a [32][32] float tile: one bank
    (lambda lane: 132 * lane, 4, 1, 1, 1),        # padded [32][33]: row stride 33 words
    (lambda lane: 64 * lane, 4, 16, 1, 16),       # stride 16 words: 2 banks, 16 words each
    (lambda lane: 4 * (lane // 8), 4, 1, 1, 1),   # 4 distinct words, broadcast to 8 lanes each
    (lambda lane: 8 * lane, 8, 2, 2, 1),          # 32 consecutive doubles: two half-warp phases
    (lambda lane: 16 * lane, 8, 4, 2, 2),         # doubles at stride 2: 2-way in each phase
    (lambda lane: 256 * lane, 8, 32, 2, 16),      # doubles down a [32][32] double column
])
def test_shared_wavefronts(addr, size, waves, ideal, degree):
    c = count_block(records(warp_access(1, addr, size=size)), INFOS).sites[1]
    assert (c.requests, c.wavefronts, c.ideal_wavefronts, c.max_degree) == (1, waves, ideal,
                                                                              degree)
    assert c.conflicted == (1 if waves > ideal else 0)
    assert c.sectors == 0  # sectors are a global-memory figure


def test_plan_small_grid_is_full_and_covers_every_block():
    plan = plan_blocks((3, 2, 2))
    assert plan.full
    assert sorted(plan.blocks) == sorted(np.ndindex(3, 2, 2))


@pytest.mark.parametrize("grid", [(32, 32, 1), (1, 40, 1), (40, 1, 3), (7, 9, 2), (1, 1, 1)])
def test_plan_sampled_classes_cover_the_grid(grid):
    plan = plan_blocks(grid, samples=2, full=False)
    assert sum(c.size for c in plan.classes) == grid[0] * grid[1] * grid[2]
    gx, gy, gz = grid
    for c in plan.classes:
        assert len(c.traced) == min(2, c.size)
        for x, y, z in c.traced:
            assert 0 <= x < gx and 0 <= y < gy and 0 <= z < gz
            edge = (x == gx - 1, y == gy - 1)
            assert c.name == {(False, False): "interior", (True, False): "last block column "
                              "(x edge)", (False, True): "last block row (y edge)",
                              (True, True): "corner"}[edge]
        # weights scale the traced blocks back to the class size
        assert c.weight * len(c.traced) == pytest.approx(c.size)
    assert len(set(plan.blocks)) == len(plan.blocks)


@pytest.mark.parametrize(("tiles_m", "tiles_n", "group_m", "batch"),
                         [(3, 3, 2, 1), (5, 4, 8, 2), (7, 2, 1, 1), (1, 6, 4, 3), (4, 1, 2, 1)])
def test_plan_classes_numbered_tiles_by_the_tile_they_own(tiles_m, tiles_n, group_m, batch):
    """pipelined, mma and wgmma number their tiles along x in a grouped order, so the edge
    tiles are anywhere in x: classed by the last x index, a sample of 64x48x16 counted 480
    load sectors where the whole launch has 448. Classed by the tile each block owns
    (the kernels' own arithmetic, launch.grouped_tile), every class is pure."""
    from tilegemm.launch import grouped_tile

    grid = (tiles_m * tiles_n, 1, batch)
    seen = {grouped_tile(t, tiles_m, tiles_n, group_m) for t in range(grid[0])}
    assert seen == {(r, c) for r in range(tiles_m) for c in range(tiles_n)}  # a permutation
    names = {(False, False): "interior", (True, False): "last block column (x edge)",
             (False, True): "last block row (y edge)", (True, True): "corner"}
    for full in (False, True):
        plan = plan_blocks(grid, samples=2, full=full, flat=(tiles_m, tiles_n, group_m))
        assert sum(c.size for c in plan.classes) == grid[0] * batch
        for c in plan.classes:
            assert len(c.traced) == (c.size if full else min(2, c.size))
            for x, y, z in c.traced:
                row, col = grouped_tile(x, tiles_m, tiles_n, group_m)
                assert c.name == names[(col == tiles_n - 1, row == tiles_m - 1)]
                assert y == 0 and 0 <= z < batch
        assert len(set(plan.blocks)) == len(plan.blocks)


def test_plan_rejects_bad_input():
    with pytest.raises(ValueError):
        plan_blocks((0, 1, 1))
    with pytest.raises(ValueError):
        plan_blocks((4, 4, 1), samples=0)


def test_occupancy_register_limited():
    # 72 regs × 32 = 2304 per warp (a multiple of 256); 16384 // 2304 = 7 warps per
    # sub-partition, 28 per SM; 8-warp blocks: 3 blocks = 24 warps of 64.
    o = occupancy(256, 72, 2048, "sm_80")
    assert (o.by_registers, o.blocks_per_sm, o.warps_per_sm) == (3, 3, 24)
    assert o.occupancy == pytest.approx(24 / 64)
    assert o.limited_by == ("registers",)


def test_occupancy_block_too_big_for_registers():
    # 1024 threads × 72 registers = 73,728 > 65,536: the launch fails on hardware.
    o = occupancy(1024, 72, 0, "sm_90")
    assert o.blocks_per_sm == 0 and "cannot launch" in o.note
    assert occupancy(1024, 64, 0, "sm_90").blocks_per_sm == 1  # exactly 65,536


def test_occupancy_shared_memory_and_block_limits():
    # 48 KiB + 1 KiB reserved = 50,176 B per block: 3 fit in 164 KiB (sm_80), 4 in 228 KiB.
    assert occupancy(64, 32, 48 * 1024, "sm_80").by_smem == 3
    assert occupancy(64, 32, 48 * 1024, "sm_90").by_smem == 4
    assert occupancy(64, 32, 48 * 1024, "sm_80").limited_by == ("shared memory",)
    # Tiny blocks hit the 32-blocks-per-SM limit: 32 × 2 warps = 64 = full occupancy.
    o = occupancy(64, 16, 0, "sm_90")
    assert (o.blocks_per_sm, o.occupancy) == (32, 1.0)
    assert set(o.limited_by) == {"warps", "blocks"}
    assert occupancy(32, 16, 0, "sm_90").occupancy == 0.5  # 32 one-warp blocks
    with pytest.raises(ValueError):
        occupancy(64, 32, 0, "sm_70")


def test_roofline_bounds():
    h100 = get_gpu("h100")
    b = bound(h100, "float32", flops=2e9, nbytes=1e9)  # 2 FLOP/B × 3.35 TB/s
    assert (b.limited_by, b.flops_per_s) == ("memory", pytest.approx(6.7e12))
    b = bound(h100, "float32", flops=1e12, nbytes=1e9)  # 1000 FLOP/B: compute roof
    assert (b.limited_by, b.flops_per_s) == ("compute", 67e12)
    assert bound(h100, "float64", 1e12, 1e9).flops_per_s == 34e12
    assert bound(h100, "int32", 1e12, 1e9).limited_by == "memory"  # no FLOP roof for ints
    # tensor-core rungs: the tensor cores' roof, a third of TF32's for 3xTF32 (three mma a
    # term); 16-bit operands at the FP16/BF16 roof. It was FP32's 67 TFLOP/s, which a TF32
    # kernel can exceed.
    assert bound(h100, "float32", 1e15, 1e9, tensor_passes=1).flops_per_s == 494.7e12
    assert bound(h100, "float32", 1e15, 1e9, tensor_passes=3).flops_per_s == pytest.approx(
        494.7e12 / 3)
    assert bound(h100, "bfloat16", 1e15, 1e9, tensor_passes=1).flops_per_s == 989.4e12
    assert "÷3 for 3xTF32" in h100.peak_label("float32", 3)
    assert "no int32 peak" in h100.peak_label("int32")
    assert all(g.tf32_tflops > g.fp32_tflops and g.fp16_tflops == pytest.approx(
        2 * g.tf32_tflops, rel=0.01) for g in GPUS.values())
    assert GPUS["a100-40gb"].bandwidth_tbs < GPUS["a100"].bandwidth_tbs
    with pytest.raises(ValueError, match="known"):
        get_gpu("v100")
