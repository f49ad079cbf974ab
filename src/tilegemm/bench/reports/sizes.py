"""``sizes`` (the optimisation note's table): GFLOP/s over M = N = K for every rung; rungs
with a block-size parameter (``BLOCK`` or ``TILE``) once per block size, others at defaults."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilegemm.bench import report as rp
from tilegemm.bench.reports import Report
from tilegemm.bench.results import Results
from tilegemm.bench.timing import Measurement

if TYPE_CHECKING:
    from tilegemm.bench.reports import PlanContext
    from tilegemm.bench.sweeps import Case
    from tilegemm.registry import KernelSpec


def sizes_tables(results: Results) -> list[rp.Table]:
    """the optimisation note's table: GFLOP/s per kernel variant (rows) and size M = N = K
    (columns)."""
    tables = []
    dtype = rp.dtype_label(results.meta.get("settings", {}))
    for be in results.backends("sizes"):
        ms = results.for_report("sizes", be)
        sizes = rp.sizes_of(ms)
        variants: dict[str, dict[int, Measurement]] = {}
        for m in rp.in_order(ms):
            variants.setdefault(m.variant, {})[m.m] = m
        where = f"{be} on {rp.device_of(results, be)}, {dtype}"
        t = rp.Table(f"GFLOP/s by size and block size — {where}",
                     ["kernel"] + [str(n) for n in sizes])
        for name, by_size in variants.items():
            t.rows.append([name] + [rp.marked_cell(by_size.get(n)) for n in sizes])
        t.notes.append("parameters: BLOCK or TILE as swept, every other one the rung's "
                       "generic default (registry, per device kind), not the tuned or "
                       "shipped parameters matmul uses (the ladder's auto row shows those)")
        t.notes += rp.problem_notes(rp.in_order(ms))
        t.notes += rp.noise_notes(rp.in_order(ms))
        if line := rp.vendor_line(results, be):
            t.notes.append(line)
        tables.append(t)
    return tables


BLOCK_PARAMS: tuple[str, ...] = ("BLOCK", "TILE")  # "block size" in the optimisation note's tables


def block_param(spec: KernelSpec) -> str | None:
    """The rung's block-size parameter (BLOCK or TILE), if it has one."""
    names = [p.name for p in spec.params]
    return next((n for n in BLOCK_PARAMS if n in names), None)


def variants(spec: KernelSpec, blocks: tuple[int, ...]) -> list[dict[str, int]]:
    """The ``blocks`` the rung's block-size parameter allows, else its defaults."""
    name = block_param(spec)
    if name is None:
        return [{}]
    choices = next(p.choices for p in spec.params if p.name == name)
    return [{name: b} for b in blocks if b in choices]


def cases(ctx: PlanContext) -> list[Case]:
    return [c for n in ctx.settings.sizes for be in ctx.backends
            for c in ctx.ladder_cases("sizes", be, n,
                                      lambda s: variants(s, ctx.settings.blocks))]


REPORT = Report("sizes", 20, cases, sizes_tables)
