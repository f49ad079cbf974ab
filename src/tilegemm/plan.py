"""``tilegemm.plan(a, b)``: what ``matmul(a, b)`` would run, and why, without running it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilegemm.problem import GemmProblem


@dataclass(frozen=True)
class Plan:
    backend: str
    device: str  # the Target's stable key, e.g. "cpu/x86_64/AMD EPYC"
    kernel: str
    rung: int
    params: dict[str, int]
    source: str  # "requested", "tuned", "database (device)", "database (isa)", "default"...
    path: str  # how the rung runs this shape (the CPU's small-product path), or ""
    dtype: str
    shape: tuple[int, int, int, int]  # batch, M, N, K

    def __str__(self) -> str:
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        b, m, n, k = self.shape
        text = (f"{self.backend}:{self.kernel} (rung {self.rung}) {params} [{self.source}] "
                f"on {self.device}, {self.dtype} {b}x{m}x{n}x{k}")
        return text + (f"; {self.path}" if self.path else "")


def plan(a: Any, b: Any, *, kernel: str = "auto", backend: str = "auto",
         device: int | None = None, trans_a: bool = False, trans_b: bool = False,
         precision: str | None = None, dtype: Any = None, **params: Any) -> Plan:
    """The backend, rung and parameters ``matmul``/``gemm`` would use for these operands, and
    why they were chosen (requested, tuned cache, shipped database, or defaults).

    Runs the same checks and the same ``kernel="auto"`` decision as a call, and nothing else:
    no compilation, no launch, no copy.
    """
    from tilegemm.api import (
        AUTO,
        _check_params_are_upper_case,
        _tensor_core_half,
        choose_backend,
        choose_kernel,
    )
    from tilegemm.precision import apply_precision
    from tilegemm.problem import describe, make_problem
    from tilegemm.tune.select import auto_plan, tuned_precision_params

    _check_params_are_upper_case(params)
    ops = [describe(a, "a"), describe(b, "b")]
    prob = make_problem(ops[0], ops[1], trans_a=trans_a, trans_b=trans_b, dtype=dtype)
    be = choose_backend(backend, ops)
    target = be.target_for(ops, device)
    # as gemm decides: 16-bit operands on tensor cores, precision= to its rung
    prob = _tensor_core_half(prob, be)
    asked_auto = kernel == AUTO and not params
    kernel, params = apply_precision(precision, kernel, be.name, prob.dtype, params)
    source = "requested"
    if asked_auto and kernel != AUTO:
        tuned = tuned_precision_params(be, target, prob, kernel, precision or "ieee")
        source = "default" if tuned is None else "tuned"
        params = params if tuned is None else tuned
    if kernel == AUTO and not params:
        spec, resolved, source = auto_plan(be, target, prob)
    else:
        spec, resolved = choose_kernel(kernel, be, prob, params, target)
    return Plan(be.name, target.key, spec.name, spec.rung, dict(resolved), source,
                _path(spec.key, prob), prob.dtype.name, (prob.batch, prob.m, prob.n, prob.k))


def _path(key: str, prob: GemmProblem) -> str:
    if key == "cpu:blocked":
        from tilegemm.kernels.cpu.k02_blocked import DIRECT_PRODUCT

        if prob.k and prob.batch * prob.m * prob.n * prob.k <= DIRECT_PRODUCT:
            return "small product: one thread, no packing"
    return ""
