"""Launch grids never exceed CUDA's limits, and grid-stride loops still cover every tile.

Needs no GPU: ``@cuda.jit`` compiles lazily, so building a rung's program (to ask for its
grid) touches no device.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from tilegemm import launch
from tilegemm.launch import MAX_GRID_X, MAX_GRID_YZ, capped_grid, ceil_div, covered
from tilegemm.registry import KernelSpec

LARGE = [0, 1, 7, 65_535, 65_536, 65_537, 200_001, 2**22, 2**22 + 3]


@pytest.mark.parametrize("batch", [0, 1, 65_535, 65_536, 70_000, 1_000_003])
@pytest.mark.parametrize("tiles", LARGE)
def test_capped_grid_within_limits(tiles: int, batch: int) -> None:
    g = capped_grid(tiles, tiles, batch)
    assert 1 <= g[0] <= MAX_GRID_X and 1 <= g[1] <= MAX_GRID_YZ and 1 <= g[2] <= MAX_GRID_YZ
    assert g[0] == max(1, tiles)  # x is never capped at these sizes
    for blocks, need in zip(g, (tiles, tiles, batch)):
        # Block b visits b, b + blocks, b + 2·blocks, ...: together the blocks visit
        # every tile exactly once.
        visited = blocks * len(covered(blocks, need)) if need else 0
        assert visited >= need
        assert blocks * (len(covered(blocks, need)) - 1) < max(need, 1)
        assert ceil_div(need, blocks) == len(covered(blocks, need))


@pytest.mark.parametrize("group_m", [1, 3, 8])
@pytest.mark.parametrize("m, n", [(1, 1), (5, 3), (130, 70), (1000, 17), (17, 1000)])
def test_numbered_tiles_cover_c_once_with_a_capped_grid(monkeypatch: pytest.MonkeyPatch,
                                                        m: int, n: int, group_m: int) -> None:
    """The rungs that number their tiles (flat_tile_grid, grouped_tile: the host's copy of
    their arithmetic) with the grid capped below the tile count: block b takes tile numbers
    b, b + grid, ... and each maps to a (row, column) tile; together every tile of C once."""
    monkeypatch.setattr(launch, "MAX_GRID_X", 7)
    rows, cols = 16, 8
    grid = launch.flat_tile_grid(rows, cols)(1, m, n)
    tiles_m, tiles_n = ceil_div(m, rows), ceil_div(n, cols)
    assert grid[0] == min(7, tiles_m * tiles_n)
    seen = np.zeros((tiles_m, tiles_n), np.int64)
    for b in range(grid[0]):
        for t in range(b, tiles_m * tiles_n, grid[0]):
            i, j = launch.grouped_tile(t, tiles_m, tiles_n, group_m)
            seen[i, j] += 1
    assert np.all(seen == 1)


def test_capped_grid_rejects_negative() -> None:
    with pytest.raises(ValueError):
        capped_grid(-1, 1, 1)


def test_capped_grid_reads_limits_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "MAX_GRID_YZ", 2)
    monkeypatch.setattr(launch, "MAX_GRID_X", 3)
    assert capped_grid(10, 10, 10) == (3, 2, 2)


@pytest.mark.parametrize("spec", tilegemm.kernels("cuda"), ids=lambda s: s.name)
def test_rung_grids_respect_limits(spec: KernelSpec) -> None:
    program = spec.program(spec.defaults(), np.dtype("float32"))
    assert all(b >= 1 for b in program.block)
    assert np.prod(program.block) == spec.threads(spec.defaults())
    for batch in (1, 3, 65_535, 65_536, 100_000):
        for m, n in [(1, 1), (2**22, 5), (5, 2**22), (2**22, 2**22), (2**20 + 1, 3)]:
            g = program.grid(batch, m, n)
            assert len(g) == 3
            assert 1 <= g[0] <= MAX_GRID_X and 1 <= g[1] <= MAX_GRID_YZ, (m, n, g)
            assert 1 <= g[2] <= MAX_GRID_YZ
            assert g[2] == min(batch, MAX_GRID_YZ)
    # a grid large enough to need no striding gets one block per tile
    small = program.grid(3, 100, 100)
    assert small[2] == 3 and small[0] * small[1] >= 1
