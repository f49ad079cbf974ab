"""Which blocks to trace for a large launch, and how their counts scale to the whole grid.

The simulator runs a few thousand thread-accesses per second per core, so a 1024³ product
cannot be traced block by block. Blocks of a GEMM launch differ only in where they sit:

- **interior** blocks own full tiles;
- the **last block column** (``blockIdx.x == gridDim.x - 1``) and the **last block row**
  (``blockIdx.y == gridDim.y - 1``) may own partial tiles (bounds checks switch lanes off);
- the **corner** block is both.

Rungs that number their tiles themselves along x (a grouped block order: pipelined, mma,
wgmma) have the edge tiles anywhere in x; for them the classes follow the tile each block
owns (``flat``: the tile counts and the group size), not the block's position.

So the grid is split into these (up to) four classes, a few blocks of each are traced
(spread over the class: first, middle and last position, and the first and last batch),
and each class's counts are scaled by ``blocks in class / blocks traced in class``. The
estimate is exact when all blocks of a class issue the same requests, which holds when
row starts keep their 32-byte alignment from block to block (K and N multiples of
8 floats); otherwise sectors per request vary a little with alignment and the estimate is
an average over the traced blocks. The report states the classes, their sizes and the
blocks traced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from tilegemm.analysis.memory import Counts

Block = tuple[int, int, int]

CLASS_NAMES = {(False, False): "interior", (True, False): "last block column (x edge)",
               (False, True): "last block row (y edge)", (True, True): "corner"}


@dataclass
class BlockClass:
    name: str
    size: int                      # blocks of this class in the grid
    traced: list[Block] = field(default_factory=list)

    @property
    def weight(self) -> float:
        return self.size / len(self.traced) if self.traced else 0.0


@dataclass
class Plan:
    grid: Block
    full: bool
    classes: list[BlockClass]

    @property
    def blocks(self) -> list[Block]:
        return [b for c in self.classes for b in c.traced]

    @property
    def total_blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def describe(self) -> dict[str, Any]:
        if self.full:
            how = f"full trace: all {self.total_blocks} blocks of the {_g(self.grid)} grid"
        else:
            parts = [f"{c.name}: {len(c.traced)} of {c.size} traced, ×{c.weight:g}"
                     for c in self.classes if c.size]
            how = (f"sampled: {len(self.blocks)} of {self.total_blocks} blocks of the "
                   f"{_g(self.grid)} grid, counts scaled per class ({'; '.join(parts)})")
        return {
            "mode": "full" if self.full else "sampled", "text": how,
            "grid": list(self.grid), "traced_blocks": len(self.blocks),
            "classes": [{"name": c.name, "blocks": c.size, "weight": c.weight,
                         "traced": [list(b) for b in c.traced]}
                        for c in self.classes if c.size],
        }


def _g(grid: Block) -> str:
    return "×".join(map(str, grid))


def _spread(lo: int, hi: int) -> list[int]:
    """First, middle and last of the integers lo..hi (deduplicated, in that order)."""
    if hi < lo:
        return []
    out: list[int] = []
    for v in (lo, (lo + hi) // 2, hi):
        if v not in out:
            out.append(v)
    return out


def plan_blocks(grid: tuple[int, int, int], *, samples: int = 2, full: bool | None = None,
                full_limit: int = 16, flat: tuple[int, int, int] | None = None) -> Plan:
    """Choose the blocks to trace: all of them for small grids, else ``samples`` per class.
    ``flat`` = (tiles_m, tiles_n, group_m) for a grid whose x numbers the tiles in the
    grouped order (:func:`tilegemm.launch.grouped_tile`)."""
    gx, gy, gz = (int(v) for v in grid)
    if min(gx, gy, gz) < 1:
        raise ValueError(f"grid {grid} has an empty dimension")
    if samples < 1:
        raise ValueError("samples must be >= 1")
    total = gx * gy * gz
    if full is None:
        full = total <= full_limit
    if flat is not None and min(flat[:2]) > 0:  # (an empty product: one idle block)
        return _plan_flat((gx, gy, gz), flat, samples, bool(full))
    classes = []
    for ey, ex in product((False, True), repeat=2):
        xs = [gx - 1] if ex else _spread(0, gx - 2)
        ys = [gy - 1] if ey else _spread(0, gy - 2)
        size = (1 if ex else gx - 1) * (1 if ey else gy - 1) * gz
        cls = BlockClass(CLASS_NAMES[(ex, ey)], size)
        if size:
            if full:
                cls.traced = [(x, y, z) for z in range(gz) for y in
                              ([gy - 1] if ey else range(gy - 1))
                              for x in ([gx - 1] if ex else range(gx - 1))]
            else:
                zs = _spread(0, gz - 1)
                n = min(samples, size)
                picks: list[Block] = []
                i = 0
                # Walk the candidates diagonally so the picks differ in x, y and z.
                while len(picks) < n and i < 3 * max(len(xs), len(ys), len(zs)) * n:
                    b = (xs[i % len(xs)], ys[i % len(ys)], zs[i % len(zs)])
                    if b not in picks:
                        picks.append(b)
                    i += 1
                for b in product(xs, ys, zs):  # small classes: fill from all candidates
                    if len(picks) >= n:
                        break
                    if b not in picks:
                        picks.append(b)
                cls.traced = picks
        classes.append(cls)
    return Plan(grid=(gx, gy, gz), full=bool(full), classes=classes)


def _plan_flat(grid: Block, flat: tuple[int, int, int], samples: int, full: bool) -> Plan:
    """:func:`plan_blocks` for a grid of numbered tiles (one row of blocks in x): each block
    classed by the tile it owns, the picks spread over the class's blocks and the batch."""
    from tilegemm.launch import grouped_tile

    gx, gy, gz = grid
    tiles_m, tiles_n, group_m = flat
    members: dict[tuple[bool, bool], list[int]] = {key: [] for key in CLASS_NAMES}
    for x in range(gx):
        row, col = grouped_tile(x, tiles_m, tiles_n, group_m)
        members[(col == tiles_n - 1, row == tiles_m - 1)].append(x)
    classes = []
    for ey, ex in product((False, True), repeat=2):
        xs = members[(ex, ey)]
        cls = BlockClass(CLASS_NAMES[(ex, ey)], len(xs) * gy * gz)
        if full:
            cls.traced = [(x, y, z) for z in range(gz) for y in range(gy) for x in xs]
        elif xs:
            spread = [xs[i] for i in _spread(0, len(xs) - 1)]
            zs = _spread(0, gz - 1)
            picks: list[Block] = []
            for i in range(len(spread) * len(zs)):  # diagonally: the picks differ in x and z
                b = (spread[i % len(spread)], 0, zs[i % len(zs)])
                if b not in picks:
                    picks.append(b)
            cls.traced = picks[:min(samples, cls.size)]
        classes.append(cls)
    return Plan(grid=grid, full=full, classes=classes)


def combine(per_block: Mapping[Block, Counts], plan: Plan) -> Counts:
    """Counts for the whole launch: each traced block weighted by its class's scale."""
    out = Counts()
    for cls in plan.classes:
        for b in cls.traced:
            out.add(per_block[b], cls.weight)
    return out
