"""Launch-grid arithmetic shared by the GPU backends.

CUDA allows 2**31-1 blocks in grid x but only 65,535 in y and z. Kernels therefore never
assume one block per tile: each loops over its tiles with a grid stride in every
dimension, and the grid asked for is capped here. Large M, N or batch counts still launch,
and the same kernel is correct for any grid size.
"""

from __future__ import annotations

from collections.abc import Callable

from tilegemm.registry import Param

MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65_535


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def capped_grid(tiles_x: int, tiles_y: int, batch: int) -> tuple[int, int, int]:
    """Blocks to launch for ``tiles_x`` × ``tiles_y`` tiles over ``batch`` products.

    Each dimension gets at least one block and at most the hardware limit; kernels stride
    over what does not fit.
    """
    if tiles_x < 0 or tiles_y < 0 or batch < 0:
        raise ValueError("tile and batch counts must be >= 0")
    return (
        max(1, min(tiles_x, MAX_GRID_X)),
        max(1, min(tiles_y, MAX_GRID_YZ)),
        max(1, min(batch, MAX_GRID_YZ)),
    )


# What a program launches for a (batch, M, N) product: blocks in (x, y, z).
Grid = Callable[[int, int, int], tuple[int, int, int]]


def tile_grid(rows: int, cols: int, *, rows_in_x: bool = False) -> Grid:
    """The grid of a kernel whose blocks each own a ``rows`` × ``cols`` tile of C: tiles
    along N in x (up to 2**31-1 blocks), along M in y, batches in z, each capped (the
    kernel strides over the rest). ``rows_in_x`` swaps x and y (rung 1's mapping)."""

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        tiles_m, tiles_n = ceil_div(m, rows), ceil_div(n, cols)
        if rows_in_x:
            return capped_grid(tiles_m, tiles_n, batch)
        return capped_grid(tiles_n, tiles_m, batch)

    return grid


def flat_tile_grid(rows: int, cols: int) -> Grid:
    """The grid of a kernel that numbers its ``rows`` × ``cols`` tiles of C itself (grouped
    block orders, see :data:`GROUP_M` and :func:`grouped_tile`): every tile in x, batches
    in z. The function carries ``tile = (rows, cols)``, so a reader of the launch (the
    tracer's choice of blocks) can tell which tile a block owns."""

    def grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
        return capped_grid(ceil_div(m, rows) * ceil_div(n, cols), 1, batch)

    grid.tile = (rows, cols)  # type: ignore[attr-defined]
    return grid


def grouped_tile(t: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """(tile row, tile column) of tile number ``t`` in the grouped block order: column-major
    inside groups of ``group_m`` tile rows, as the kernels with a :func:`flat_tile_grid`
    compute it (the host's copy of their arithmetic)."""
    group = group_m * tiles_n
    first = (t // group) * group_m
    size = min(tiles_m - first, group_m)
    return first + (t % group) % size, (t % group) // size


# The parameter of the grouped block order, declared once for the rungs that use it.
# Blocks run roughly in launch order, so the tiles of C in flight together decide what L2
# holds; numbering tiles column-major inside groups of GROUP_M tile rows makes them a
# near-square patch, whose panels of A and B each serve several blocks from L2.
GROUP_M = Param("GROUP_M", 8, (1, 2, 4, 8, 16), "tile rows per group of the block order")


def covered(grid: int, tiles: int) -> list[int]:
    """Tiles block ``0`` visits with a grid stride (used by tests of the stride loops)."""
    return list(range(0, tiles, grid))
