"""A faster numba-cuda lowering step, so the written-out rungs compile in half the time.

numba-cuda's lowering looks for variables assigned exactly once (they become SSA values
instead of stack slots). For every candidate variable it scans all assignments of the
variable's block again, so a block of n assignments costs n² work. Our fastest rungs write
their k steps out in full (thousands of assignments in one block), and this search alone
took about 40 % of a 40-second compile. Numba itself counts the assignments of each block
once instead (the same result in one pass); numba-cuda still carries the quadratic version.

:func:`install` replaces numba-cuda's method with the one-pass version. It decides exactly
the same set of variables (tests compare the two on real rungs), so the PTX is unchanged.
The original stays reachable as ``Lower._tilegemm_original_find_singly_assigned``.

Private (underscore) module: discovery does not look for a rung here; numba-cuda is
imported only when :func:`install` is called (from a rung's build on a real compile path).
"""

from __future__ import annotations

from collections import defaultdict

_INSTALLED = False


def install() -> None:
    """Patch numba-cuda's singly-assigned-variable search (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    try:
        from numba.cuda import lowering
    except ImportError:  # no numba-cuda: nothing to speed up
        return
    lower = lowering.Lower
    original = getattr(lower, "_find_singly_assigned_variable", None)
    if original is None or not hasattr(lowering, "compute_use_defs"):
        return  # a numba-cuda whose lowering differs: leave it alone
    lower._tilegemm_original_find_singly_assigned = original
    lower._find_singly_assigned_variable = _find_singly_assigned_variable
    _INSTALLED = True


def _find_singly_assigned_variable(self) -> None:  # noqa: ANN001 - a numba Lower method
    """numba-cuda's ``Lower._find_singly_assigned_variable`` with the per-block assignment
    counts computed once (as numba's own lowering does) instead of once per variable."""
    from numba.cuda import lowering

    ir = lowering.ir
    sav: set[str] = set()
    if not self.func_ir.func_id.is_generator:
        blocks = self.func_ir.blocks
        use_defs = lowering.compute_use_defs(blocks)
        alloca_vars = lowering.must_use_alloca(blocks)

        var_assign_map: dict[str, set[int]] = defaultdict(set)
        for blk, names in use_defs.defmap.items():
            for var in names:
                var_assign_map[var].add(blk)
        used: set[str] = set()
        for names in use_defs.usemap.values():
            used.update(names)

        counts: dict[int, dict[str, int]] = {}
        for var, defblks in var_assign_map.items():
            if var in alloca_vars or len(defblks) != 1 or var in used:
                continue
            [defblk] = defblks
            per_block = counts.get(defblk)
            if per_block is None:
                per_block = defaultdict(int)
                for stmt in self.blocks[defblk].find_insts(ir.assign_types):
                    per_block[stmt.target.name] += 1
                counts[defblk] = per_block
            if per_block[var] == 1:
                sav.add(var)

    self._singly_assigned_vars = sav
    self._blk_local_varmap = {}
