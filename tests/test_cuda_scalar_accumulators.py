"""The written-out k steps of rungs 6-9 keep their accumulators in named scalars, one new
name per k step, in K order (k08_warptile.k_step). Pure source generation: no numba, no GPU.

Why it matters: numba types and lowers every statement of the ~1,000 FMAs of a k-tile one
by one, and its SSA reconstruction is quadratic in the reassignments of one name inside a
block (docs/performance.md, "First-call compile time"). A k-tile that assigns a name twice,
or goes back to ``acc[i, j] +=``, still computes the right product, so only this test sees
it."""

from __future__ import annotations

import ast
import re

import pytest

from tilegemm.kernels.cuda import k08_warptile as wt
from tilegemm.kernels.cuda._access import width
from tilegemm.registry import get

STEP = re.compile(r"c(\d+)_(\d+)(?:_k(\d+)(_b\d)?)?$")


def _k_tile(name: str, itemsize: int) -> tuple[list[str], int, int, int]:
    """The source lines of one written-out k-tile of a rung at its defaults, and its
    RT, CT and BK."""
    spec = get(name, "cuda")
    p = spec.defaults()
    w = width(itemsize)
    rpw = max(w, 32 * w // p["BK"])
    if name in ("warptile", "pipelined"):
        t = wt.WarpTiles.of(p)
        rt, ct = t.RT, t.CT
    else:
        rt, ct = p["TM"], p["TN"]
    if name == "vectorized":
        lines = wt._compute_rows(p, w, rt, ct)
    else:
        lines = wt._compute(p, w, rpw, rt, ct, "1, " if name == "pipelined" else "")
    return lines, rt, ct, p["BK"]


@pytest.mark.parametrize("name", ["vectorized", "smem_layout", "warptile", "pipelined"])
def test_k_tile_sums_in_named_scalars_in_k_order(name: str) -> None:
    lines, rt, ct, bk = _k_tile(name, 4)
    tree = ast.parse("\n".join(lines))
    assigned: list[str] = []
    last: dict[tuple[int, int], str] = {}
    steps: dict[tuple[int, int], int] = {}
    for stmt in tree.body:
        assert isinstance(stmt, ast.Assign), ast.unparse(stmt)  # no +=, no acc[...] =
        for target in stmt.targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            assert all(isinstance(x, ast.Name) for x in names), ast.unparse(stmt)
            assigned += [x.id for x in names]
        out = stmt.targets[0]
        if isinstance(out, ast.Name) and STEP.match(out.id):
            i, j = (int(x) for x in STEP.match(out.id).groups()[:2])
            value = stmt.value  # c_prev + a * b, the expression NVVM contracts to an FMA
            assert isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)
            assert isinstance(value.right, ast.BinOp) and isinstance(value.right.op, ast.Mult)
            prev = value.left.id
            assert prev == last.get((i, j), f"c{i}_{j}"), ast.unparse(stmt)  # K order
            last[(i, j)] = out.id
            steps[(i, j)] = steps.get((i, j), 0) + 1
    # Every name once in the whole k-tile (the accumulators themselves: read by the
    # first step, written by the last).
    assert len(assigned) == len(set(assigned))
    assert len(steps) == rt * ct and set(steps.values()) == {bk}
    assert all(last[(i, j)] == f"c{i}_{j}" for i, j in last)
    assert "acc" not in "\n".join(lines)


@pytest.mark.parametrize("name", ["vectorized", "pipelined"])
def test_float64_loop_updates_the_accumulators_in_place(name: str) -> None:
    """float64 keeps the k steps of these two a loop: the FMAs update c{i}_{j} itself."""
    p = get(name, "cuda").defaults()
    if name == "vectorized":
        lines = wt._compute_rows(p, 2, p["TM"], p["TN"], written_out=False)
    else:
        from tilegemm.kernels.cuda.k09_pipelined import _compute_loop

        t = wt.WarpTiles.of(p)
        lines = _compute_loop(p, 2, 8, t.RT, t.CT, 0, t.row_off, t.col_off)
    fmas = [x.strip() for x in lines if re.match(r"\s*c\d+_\d+ =", x)]
    assert fmas and all(re.fullmatch(r"(c\d+_\d+) = \1 \+ a\d+ \* b\d+", x) for x in fmas)
