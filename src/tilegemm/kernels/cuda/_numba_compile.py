"""Faster numba-cuda compile steps, so the written-out rungs compile in half the time.

numba-cuda's lowering looks for variables assigned exactly once (they become SSA values
instead of stack slots). For every candidate variable it scans all assignments of the
variable's block again, so a block of n assignments costs n² work. Our fastest rungs write
their k steps out in full (thousands of assignments in one block), and this search alone
took about 40 % of a 40-second compile. Numba itself counts the assignments of each block
once instead (the same result in one pass); numba-cuda still carries the quadratic version.

:func:`install` replaces numba-cuda's method with the one-pass version. It decides exactly
the same set of variables (tests compare the two on real rungs), so the PTX is unchanged.
The original stays reachable as ``Lower._tilegemm_original_find_singly_assigned``.

It also remembers, for the length of one function's type inference, what each call
resolved to: numba-cuda types every call by asking each of the function's templates in
turn (about nine per call), and a written-out k loop makes the same call with the same
argument types thousands of times (96 % of the calls of the CUDA rungs' defaults repeat
one already typed in that compile). A call typed once gives the same signature the next
time within one type inference (the templates and the context do not change during it),
so the second answer is the first one, looked up: 18 % off compiling the rungs' defaults
(163 → 134 s for rungs 6–11 on a 2-vCPU Xeon), the PTX byte for byte the same (tested).
Calls whose argument types cannot be hashed, and those that fail, are typed as before.

And its SSA reconstruction hands its handlers only the statements that name the variable
being fixed. numba-cuda fixes each variable assigned more than once (in a written-out rung,
every accumulator: 84 variables in pipelined) by passing every statement of every block
to a handler, twice; a handler changes only statements that name that variable. Found
once where each variable is named, the same rewrites touch a few statements each: SSA
1.9 → 0.4 s of a 12-second compile of pipelined; eleven rung/dtype defaults (rungs 5-11)
68.6 → 56.3 s on a 2-vCPU Xeon, their PTX byte for byte the same (PYTHONHASHSEED=0).

Two more, each the same result for less work. Variable liveness (``compute_live_map``,
run after every rewriting pass) is found on bit sets by a worklist instead of sweeps of
Python set unions (:func:`live_map`); and lowering remembers, within one function, the
signature of each operator it has looked up (it asks again for every operation). All
24 rung/dtype defaults: 117.8 → 89.1 s on the same Xeon, their PTX the same (up to the
order of numba's environment declarations, which varies between runs without these
changes too). With every change here against none, five written-out defaults (warptile
and pipelined float32, mma float32 and float16, wgmma float32): 52 → 27 s.

Private (underscore) module: discovery does not look for a rung here; numba-cuda is
imported only when :func:`install` is called (from a rung's build on a real compile path).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from types import BuiltinFunctionType
from typing import Any

_INSTALLED = False
_TYPING = threading.local()  # .memo: the calls typed in this thread's current inference
_SSA = threading.local()  # .names: what names what, in this thread's current SSA pass
_LOWERING = threading.local()  # .memo: the call types looked up in this thread's lowering


def install() -> None:
    """Patch numba-cuda's singly-assigned-variable search, its typing of calls, its SSA
    rewrites, its liveness and its lowering's signature lookups (idempotent; each only where
    numba-cuda's code is the one these were written for)."""
    global _INSTALLED
    if _INSTALLED:
        return
    try:
        from numba.cuda import lowering
    except ImportError:  # no numba-cuda: nothing to speed up
        return
    _INSTALLED = True
    lower = lowering.Lower
    original = getattr(lower, "_find_singly_assigned_variable", None)
    if original is not None and hasattr(lowering, "compute_use_defs"):
        lower._tilegemm_original_find_singly_assigned = original
        lower._find_singly_assigned_variable = _find_singly_assigned_variable
    _remember_typed_calls()
    _remember_call_types_in_lowering(lower)
    _fix_ssa_only_where_named()
    _live_map_by_bits()


def _fix_ssa_only_where_named() -> None:
    """SSA reconstruction hands its handlers only the statements that name the variable
    being fixed (see :class:`_Names`)."""
    try:
        from numba.cuda.core import ssa
    except ImportError:
        return
    if not all(hasattr(ssa, name) for name in ("_run_ssa", "_run_block_rewrite")):
        return
    run_ssa = ssa._tilegemm_original_run_ssa = ssa._run_ssa
    ssa._tilegemm_original_run_block_rewrite = ssa._run_block_rewrite
    assign_types = ssa.ir.assign_types

    def with_names(blocks: Any) -> Any:
        outer = getattr(_SSA, "names", None)
        _SSA.names = _Names(blocks)
        try:
            return run_ssa(blocks)
        finally:
            _SSA.names = outer

    def rewrite_naming(blocks: Any, states: Any, handler: Any) -> Any:
        names = getattr(_SSA, "names", None)
        varname = states.get("varname")
        if names is None or varname is None:
            return ssa._tilegemm_original_run_block_rewrite(blocks, states, handler)
        spots = names.spots.get(varname, {})
        newblocks = {}
        for label, blk in blocks.items():
            newblk = ssa.ir.Block(scope=blk.scope, loc=blk.loc)
            newblk.body = body = list(blk.body)  # a statement not naming it comes back as is
            if label in spots:
                states["label"] = label
                states["block"] = blk
                shift = len(body) - names.length[label]  # phi nodes put in front since
                for i in spots[label]:
                    stmt = body[i + shift]
                    body[i + shift] = (handler.on_assign(states, stmt)
                                       if isinstance(stmt, assign_types)
                                       else handler.on_other(states, stmt))
            newblocks[label] = newblk
        return newblocks

    ssa._run_ssa = with_names
    ssa._run_block_rewrite = rewrite_naming


class _Names:
    """Where each variable is named: for each variable, for each block whose statements
    name it (assigned or used), their positions in the block, in order.

    numba fixes one variable at a time, each in two rewrites of every block; a handler
    changes a statement only if it names that variable, and gives back the others as they
    are. So only those statements are handed to it, in the order numba would. Fixing a
    variable renames only that variable, in copies of the statements that name it, at the
    same positions, and then puts phi nodes of it (naming no other variable) at the front
    of some blocks, which shifts the positions there by as many."""

    def __init__(self, blocks: Any) -> None:
        self.spots: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.length = {label: len(blk.body) for label, blk in blocks.items()}
        for label, blk in blocks.items():
            for i, stmt in enumerate(blk.body):
                for name in {v.name for v in stmt.list_vars()}:
                    self.spots[name][label].append(i)


def _live_map_by_bits() -> None:
    """numba-cuda's variable liveness (``compute_live_map``) computed on bit sets."""
    try:
        from numba.cuda.core import analysis, ir_utils
    except ImportError:
        return
    if not hasattr(analysis, "compute_live_map"):
        return
    analysis._tilegemm_original_compute_live_map = analysis.compute_live_map
    analysis.compute_live_map = live_map
    if getattr(ir_utils, "compute_live_map", None) is analysis._tilegemm_original_compute_live_map:
        ir_utils.compute_live_map = live_map


def live_map(cfg: Any, blocks: Any, var_use_map: Any, var_def_map: Any) -> dict[Any, set[str]]:
    """The variables live at the entry of each block: what numba-cuda's
    ``compute_live_map`` returns, computed on Python integers as bit sets.

    numba-cuda finds two fixed points (the variables whose definition can reach a block,
    then those live at its entry) by sweeping every block, each sweep uniting Python sets
    of names, until a sweep changes no set's size. A written-out rung has thousands of
    variables over a few hundred blocks, and its compile runs this nine times or more:
    3.2 s of a 10-second compile of pipelined. Both fixed points are the least solutions
    of the same equations whatever the order of work, so a worklist over bit sets (one
    bit a variable) reaches the same sets:

    - reach(b) holds what b uses or defines, and reach(p) for every block p with an edge
      to b (numba propagates from the blocks that have use/def sets only);
    - live(b) holds what b uses, and (live(s) ∩ reach(b)) − def(b) for every successor s.
    """
    bit: dict[str, int] = {}

    def bits(names: Any) -> int:
        mask = 0
        for name in names:
            at = bit.get(name)
            if at is None:
                at = bit[name] = len(bit)
            mask |= 1 << at
        return mask

    uses = {label: bits(names) for label, names in var_use_map.items()}
    defs = {label: bits(names) for label, names in var_def_map.items()}
    reach: dict[Any, int] = defaultdict(int)
    for label in var_def_map:
        reach[label] |= uses[label] | defs[label]
    work = list(var_def_map)
    while work:
        label = work.pop()
        mask = reach[label]
        for succ, _ in cfg.successors(label):
            if mask & ~reach[succ]:
                reach[succ] |= mask
                if succ in var_def_map:
                    work.append(succ)
    live = {label: uses[label] for label in blocks}
    work = list(live)
    while work:
        label = work.pop()
        mask = live[label]
        for pred, _ in cfg.predecessors(label):
            more = mask & reach[pred] & ~defs[pred]
            if more & ~live[pred]:
                live[pred] |= more
                work.append(pred)
    names = list(bit)
    return {label: _names_of(mask, names) for label, mask in live.items()}


def _names_of(mask: int, names: list[str]) -> set[str]:
    """The names whose bits are set in ``mask``."""
    ones = bin(mask)[:1:-1]  # bit i at position i
    found: set[str] = set()
    at = ones.find("1")
    while at >= 0:
        found.add(names[at])
        at = ones.find("1", at + 1)
    return found


def _call_key(args: Any, kws: Any) -> tuple[Any, Any]:
    """A call's argument types and keywords as part of a memory's key (a key holding a type
    that cannot be hashed raises TypeError when looked up)."""
    return tuple(args), tuple(sorted(kws.items())) if kws else ()


def _with_memory(local: threading.local, method: Any) -> Any:
    """``method`` run with a fresh dict as ``local.memo``, the outer one restored after (a
    callee compiled inside its caller's compile has a memory of its own)."""
    def run(self: Any, *args: Any) -> Any:
        outer = getattr(local, "memo", None)
        local.memo = {}
        try:
            return method(self, *args)
        finally:
            local.memo = outer
    return run


def _remember_typed_calls() -> None:
    """Within one type inference, a call typed once is answered from memory after."""
    try:
        from numba.cuda.core import typed_passes
        from numba.cuda.typing import context
    except ImportError:
        return
    base, inference = context.BaseContext, typed_passes.BaseTypeInference
    if not (hasattr(base, "resolve_function_type") and hasattr(inference, "run_pass")):
        return
    base._tilegemm_original_resolve_function_type = base.resolve_function_type

    def resolve(self: Any, func: Any, args: Any, kws: Any) -> Any:
        return base._tilegemm_original_resolve_function_type(self, func, args, kws)

    def remembered(self: Any, func: Any, args: Any, kws: Any) -> Any:
        memo = getattr(_TYPING, "memo", None)
        if memo is None:
            return resolve(self, func, args, kws)
        try:
            key = (id(self), func, *_call_key(args, kws))
            found = memo.get(key, memo)
        except TypeError:  # an argument type that cannot be hashed
            return resolve(self, func, args, kws)
        if found is memo:
            found = memo[key] = resolve(self, func, args, kws)
        return found

    base.resolve_function_type = remembered
    inference.run_pass = _with_memory(_TYPING, inference.run_pass)


def _remember_call_types_in_lowering(lower: Any) -> None:
    """Within one function's lowering, an operator's signature looked up once is answered
    from memory after.

    Lowering asks again for the signature of every operator it emits (numba's
    ``BaseFunction.get_call_type``, which tries the operator's templates in turn), once
    more for each binary operation with a constant operand: 10518 lookups compiling eight
    rung defaults, 99 % of them repeats, 4.3 of 42 s. Within one lowering the templates and
    the context do not change, so a repeat gets the first answer. Only operators and
    built-in functions (``operator.add``, ``getitem``...) are remembered: typing an
    intrinsic or an overload may compile its implementation, which must happen as
    before. The lookup also records which implementation the signature came from
    (``_impl_keys``); a repeat records it again, as the original would. Outside a CUDA
    lowering (numba's CPU compiles in this process) every lookup goes to numba's method
    unchanged; lookups that fail are never remembered."""
    try:
        from numba.core.types import functions
    except ImportError:
        return
    base = functions.BaseFunction
    if not (hasattr(base, "get_call_type") and hasattr(lower, "lower")):
        return
    base._tilegemm_original_get_call_type = base.get_call_type

    def get_call_type(self: Any, context: Any, args: Any, kws: Any) -> Any:
        return base._tilegemm_original_get_call_type(self, context, args, kws)

    def remembered(self: Any, context: Any, args: Any, kws: Any) -> Any:
        memo = getattr(_LOWERING, "memo", None)
        if memo is None or not isinstance(self.typing_key, BuiltinFunctionType):
            return get_call_type(self, context, args, kws)
        try:
            key = (self, id(context), *_call_key(args, kws))
            found = memo.get(key)
        except TypeError:  # an argument type that cannot be hashed
            return get_call_type(self, context, args, kws)
        if found is None:
            sig = get_call_type(self, context, args, kws)
            if sig is not None:
                memo[key] = (sig, self._impl_keys.get(sig.args))
            return sig
        sig, impl = found
        if impl is not None:
            self._impl_keys[sig.args] = impl
        return sig

    base.get_call_type = remembered
    lower.lower = _with_memory(_LOWERING, lower.lower)


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
