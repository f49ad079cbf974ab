"""``tilegemm.plan(a, b)``: what ``matmul(a, b)`` would run, and why, without running it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tilegemm.errors import InvalidTypeError
from tilegemm.problem import GemmProblem


@dataclass(frozen=True)
class Plan:
    """What ``matmul``/``gemm`` would run for given operands, and why.

    - ``backend``, ``kernel``, ``rung``: the backend (one that :func:`tilegemm.backends`
      lists), the rung's name and its number on the ladder (``tilegemm kernels`` lists them).
    - ``device``: where it runs, as ``backend/architecture/device name``.
    - ``params``: the rung's parameters (``MR=8 NR=32 ...``, see each rung's docstring).
    - ``source``: why these parameters. "requested" (given in the call), "tuned" (your own
      ``tilegemm tune`` results), "database (device)" / "database (isa)" (measurements
      shipped with tilegemm for this CPU or GPU model, or for its instruction set),
      "default" (the rung's defaults), "simulator" (CUDA simulator defaults), or
      "requested; the others from ..." when some parameters were given.
    - ``path``: how the rung runs this shape when it has more than one way: on the CPU the
      small-product path (on the calling thread), the one-row-or-column path, a batch
      split between the threads, or packed panels; else "".
    - ``dtype``: the type the kernel computes in (int32 for int8 operands, float32 for
      float16 on the CPU), not necessarily the result's type, which is ``np.matmul``'s.
    - ``shape``: (batch, M, N, K) after NumPy's promotion and broadcasting, as the rung
      computes it: a C-ordered batch of A times one matrix B, (..., M, K) @ (K, N), is one
      product of all the batch's rows, (1, batch·M, N, K), and ``path`` says so.
    """

    backend: str
    device: str  # the Target's stable key, e.g. "cpu/x86_64/AMD EPYC"
    kernel: str
    rung: int
    params: dict[str, int]
    source: str  # "requested", "tuned", "database (device)", "database (isa)", "default"...
    path: str  # how the rung runs this shape (the CPU's paths), or ""
    dtype: str
    shape: tuple[int, int, int, int]  # batch, M, N, K

    def __str__(self) -> str:
        params = "".join(f" {k}={v}" for k, v in self.params.items())
        b, m, n, k = self.shape
        text = (f"{self.backend}:{self.kernel} (rung {self.rung}){params} [{self.source}] "
                f"on {self.device}, batch={b} M={m} N={n} K={k} computed in {self.dtype}")
        return text + (f"; {self.path}" if self.path else "")


def plan(a: Any, b: Any, c: Any = None, *, kernel: str = "auto", backend: str = "auto",
         device: int | None = None, trans_a: bool = False, trans_b: bool = False,
         precision: str | None = None, dtype: Any = None, **params: Any) -> Plan:
    """The backend, rung and parameters ``matmul``/``gemm`` would use for these operands, and
    why they were chosen (requested, tuned cache, shipped database, or defaults).

    Runs the same checks on ``a``, ``b`` and the options, and makes the same decision, as a
    call (the very code ``matmul`` runs), and nothing else: no compilation, no launch, no
    copy. ``c`` is ``gemm``'s: only where it lives matters (a device ``c`` chooses the
    backend, as device operands do). ``out``, ``alpha`` and ``beta`` do not change the
    decision and are not taken here, so their checks happen only in the call (an ``out``
    the result is written into can also make a product fit in memory that would not fit
    otherwise). Returns a :class:`Plan`; raises what ``matmul`` raises for the same
    operands and options.
    """
    from tilegemm.api import _check_params_are_upper_case, decide, describe_c
    from tilegemm.problem import describe, make_problem, stacked_rows

    call_only = sorted(set(params) & {"out", "alpha", "beta"})
    if call_only:
        raise InvalidTypeError(
            f"plan() takes no {', '.join(call_only)}: "
            f"{'they do' if len(call_only) > 1 else 'it does'} not change which backend, rung "
            "and parameters run; pass the operands, c and the options that do")
    _check_params_are_upper_case(params)
    # a batch times one matrix runs as one product of the batch's rows, as in matmul
    stacked = stacked_rows(a, b, c, None, trans_a, trans_b)
    if stacked is not None:
        a, b, c = stacked.a, stacked.b, stacked.c
    ops = [describe(a, "a"), describe(b, "b")]
    prob = make_problem(ops[0], ops[1], trans_a=trans_a, trans_b=trans_b, dtype=dtype)
    if c is not None:
        ops.append(describe_c(c, prob))
    chosen = decide(ops, prob, kernel=kernel, backend=backend, device=device,
                    precision=precision, params=params)
    spec, prob = chosen.spec, chosen.prob
    path = _path(spec.key, prob, chosen.params, a, b)
    if stacked is not None:
        path = "; ".join(filter(None, (
            f"a batch of {stacked.batch} times one matrix, as one product of its {prob.m} "
            "rows stacked", path)))
    return Plan(chosen.backend.name, chosen.target.key, spec.name, spec.rung,
                dict(chosen.params), chosen.source, path, prob.dtype.name,
                (prob.batch, prob.m, prob.n, prob.k))


def _path(key: str, prob: GemmProblem, params: Mapping[str, int], a: Any = None,
          b: Any = None) -> str:
    """The chosen rung's path for the product, in words; ``a``, ``b``: the caller's
    operands, whose layouts can decide it (None: C-ordered, as ``tilegemm run`` makes)."""
    if key == "cpu:blocked":
        from tilegemm.kernels.cpu._threads import planned_threads
        from tilegemm.kernels.cpu.k02_blocked import path
        from tilegemm.problem import stored_transposed

        a_transposed = stored_transposed(a, prob, "a")
        b_transposed = stored_transposed(b, prob, "b")

        return path(prob.batch, prob.m, prob.n, prob.k, planned_threads(), params,
                    itemsize=prob.dtype.itemsize, a_transposed=a_transposed,
                    b_transposed=b_transposed)
    return ""
