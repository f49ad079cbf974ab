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
        params = "".join(f" {k}={v}" for k, v in self.params.items())
        b, m, n, k = self.shape
        text = (f"{self.backend}:{self.kernel} (rung {self.rung}){params} [{self.source}] "
                f"on {self.device}, {self.dtype} {b}x{m}x{n}x{k}")
        return text + (f"; {self.path}" if self.path else "")


def plan(a: Any, b: Any, *, kernel: str = "auto", backend: str = "auto",
         device: int | None = None, trans_a: bool = False, trans_b: bool = False,
         precision: str | None = None, dtype: Any = None, **params: Any) -> Plan:
    """The backend, rung and parameters ``matmul``/``gemm`` would use for these operands, and
    why they were chosen (requested, tuned cache, shipped database, or defaults).

    Runs the same checks and the same decision as a call (:func:`tilegemm.api.decide`, the
    code ``matmul`` runs), and nothing else: no compilation, no launch, no copy.
    """
    from tilegemm.api import _check_params_are_upper_case, decide
    from tilegemm.problem import describe, make_problem

    _check_params_are_upper_case(params)
    ops = [describe(a, "a"), describe(b, "b")]
    prob = make_problem(ops[0], ops[1], trans_a=trans_a, trans_b=trans_b, dtype=dtype)
    chosen = decide(ops, prob, kernel=kernel, backend=backend, device=device,
                    precision=precision, params=params)
    spec, prob = chosen.spec, chosen.prob
    return Plan(chosen.backend.name, chosen.target.key, spec.name, spec.rung,
                dict(chosen.params), chosen.source, _path(spec.key, prob), prob.dtype.name,
                (prob.batch, prob.m, prob.n, prob.k))


def _path(key: str, prob: GemmProblem) -> str:
    if key == "cpu:blocked":
        from tilegemm.kernels.cpu.k02_blocked import DIRECT_PRODUCT

        if prob.k and prob.batch * prob.m * prob.n * prob.k <= DIRECT_PRODUCT:
            return "small product: on the calling thread, no thread pool"
    return ""
