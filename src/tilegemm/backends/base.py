"""The small interface every backend implements, and what they share.

A backend owns one kind of array ("host" NumPy, "cuda" device arrays, "opencl" arrays),
knows whether it can run here (and why not), and owns every fact about its devices: it
describes the device a call will run on as a :class:`Target` (a stable key, the kind, the
architecture, the limits, the timer, the vendor reference, details for results files).
Everything that depends on the device (default parameters, limit checks, launches,
benchmarks, the tuner's search space and its cache key) is decided from that Target, so
``device=`` is applied before anything else and no module outside ``backends/`` needs to
know which backend it is talking to.
"""

from __future__ import annotations

import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilegemm.errors import InvalidTypeError, InvalidValueError, UnavailableError
from tilegemm.problem import GemmProblem, Operand
from tilegemm.registry import KernelSpec


@dataclass(frozen=True)
class BackendStatus:
    name: str
    usable: bool
    reason: str
    devices: tuple[str, ...] = ()
    simulated: bool = False  # e.g. numba's CUDA simulator: correct but very slow
    accelerated: bool = False  # a real GPU (or other accelerator): kernel="auto" prefers it
    # Why the default device cannot run although another device can ("" when it can): the
    # backend stays usable with device=, and a call without device= is refused with this.
    default_problem: str = ""


@dataclass(frozen=True)
class Limits:
    """What one block (work-group) may use on a device; the checks and the tuner read these.

    A zero means "no such limit here" (the CPU has no register file to share, PoCL does
    not report registers).
    """

    threads_per_block: int
    block_dims: tuple[int, ...] = ()  # the most threads along each block dimension
    shared_per_block: int = 0  # bytes of (static) shared / local memory per block
    # bytes of dynamic shared memory a block may use once its kernel opts in (CUDA's
    # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN); 0: no more than shared_per_block
    shared_optin_per_block: int = 0
    registers_per_block: int = 0  # the register file one block may use (CUDA: per SM)
    registers_per_thread: int = 0
    max_allocation: int = 0  # bytes of the largest single buffer


@dataclass(frozen=True)
class Target:
    """The one device a call runs on, as its backend describes it.

    Made by :meth:`Backend.target` before anything else is decided, so parameters,
    defaults and limits are always those of the device that runs the kernel. ``key`` is
    stable across processes and device orderings (the tuner's cache and the compile cache
    key on it); ``index`` is the ``device=`` number, which can change when hardware does.
    """

    backend: str  # the registry's backend name
    name: str  # the device's own name, e.g. "NVIDIA H100 80GB HBM3"
    kind: str  # "gpu", "cpu", "accelerator" or "simulator"
    arch: str  # CUDA "sm_90"; the machine ("x86_64") for host code; "" when unknown
    limits: Limits
    timer: str  # what measures a launch: "CUDA events", "perf_counter"...
    index: int | None = None  # the device= index, when the backend has several devices
    capability: tuple[int, ...] = ()  # CUDA compute capability (9, 0); () when none
    simulated: bool = False  # correct but slow (numba's CUDA simulator): never timed
    accelerated: bool = False  # a real GPU or other accelerator
    vendors: tuple[str, ...] = ()  # vendor references to time against, tried in order
    # Blocks that run at once, one per unit: CUDA's streaming multiprocessors (SMs), 0 when
    # unknown. Decides whether a product's tiles fill the device (tile size, split-K).
    compute_units: int = 0
    handle: Any = field(default=None, compare=False, hash=False, repr=False)  # backend's own

    @property
    def key(self) -> str:
        """A stable device key: backend, architecture and device name (no index); a device
        without an architecture string (OpenCL) is ``backend/name``."""
        return "/".join(part for part in (self.backend, self.arch, self.name) if part)

    @property
    def known_capability(self) -> tuple[int, ...] | None:
        """The compute capability of a real GPU; None without one, and under the simulator,
        which stands for any GPU (kernel="auto" then keeps to rungs that run on every one)."""
        return None if self.simulated or not self.capability else self.capability


@dataclass(frozen=True)
class Prepared:
    """One product set up for repeated launches, operands already resident on the device.

    Benchmarks and the tuner time kernels, not transfers or Python dispatch: ``launch``
    enqueues one launch on data prepared once; ``elapsed(n)`` runs ``n`` launches and returns
    each one's device-measured time in seconds (CUDA events, OpenCL profiling events,
    ``perf_counter`` on the CPU); ``fetch`` copies the (batch, M, N) result to the host for
    verification.
    """

    launch: Callable[[], None]
    fetch: Callable[[], np.ndarray]
    elapsed: Callable[[int], list[float]]


def wall_clock_elapsed(launch: Callable[[], None], n: int) -> list[float]:
    """``Prepared.elapsed`` for synchronous launches (the CPU, NumPy, the CUDA simulator):
    each launch timed with ``perf_counter``."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        launch()
        times.append(time.perf_counter() - t0)
    return times


def poison_enabled() -> bool:
    """``TILEGEMM_POISON=1`` makes backends fill fresh outputs with NaN (ints: a sentinel)
    before a launch, so a kernel that skips an element is caught by the check."""
    return os.environ.get("TILEGEMM_POISON", "") not in ("", "0")


def poison_value(dtype: np.dtype) -> Any:
    dtype = np.dtype(dtype)
    floating = dtype.kind == "f" or dtype.name == "bfloat16"  # (ml_dtypes: kind "V")
    return np.nan if floating else np.iinfo(dtype).min + 7


def check_scalars(prob: GemmProblem, alpha: Any, beta: Any) -> None:
    """Refuse an alpha or beta the product cannot take (see :func:`resolve_scalars`),
    converting nothing (so no conversion warning is issued twice)."""
    _checked(prob, alpha, beta)


def resolve_scalars(prob: GemmProblem, alpha: Any, beta: Any) -> tuple[Any, Any]:
    """alpha and beta as scalars of the problem dtype (kernels do no wider math).

    For an integer or bool result they must be integers that fit the caller's result
    dtype (``np.uint8(-1)`` is an error in NumPy too), checked against that dtype, not the
    wider one it is computed in, and converted with NumPy's wrapping cast (uint64's
    ``2**64 - 1`` is int64's -1, which gives the same products modulo 2**64). For a float
    result, a number too large for a float (an int such as ``10**400``) is refused.
    """
    t = prob.dtype.type
    checked = _checked(prob, alpha, beta)
    if checked is None:
        # Sums in float32 for a narrower result are scaled by float32 scalars rounded to
        # the result's dtype first, as NumPy rounds a Python number that multiplies a
        # float16 array, and alike on every backend: 16-bit operands on tensor cores (the
        # stored dtype; a float32 result keeps 0.1 as float32, not as bfloat16's
        # 0.10009765625), and a float16 or bfloat16 result computed in float32 elsewhere
        # (alpha=1e5 was finite there and inf on tensor cores). From the value itself:
        # bfloat16 takes no Decimal.
        if prob.dtype.itemsize == 2:
            return tuple(np.float32(prob.store_dtype.type(float(x))) for x in (alpha, beta))
        narrow = prob.out_dtype
        if narrow.itemsize == 2 and prob.dtype.kind == "f":
            return tuple(t(narrow.type(float(x))) for x in (alpha, beta))
        return t(alpha), t(beta)
    values, dtype = checked
    return tuple(t(np.array(v, dtype=dtype).astype(prob.dtype)[()]) for v in values)


def _checked(prob: GemmProblem, alpha: Any, beta: Any
             ) -> tuple[list[int], np.dtype] | None:
    """The validation of :func:`resolve_scalars`: for an integer product, the two values
    as Python ints and the dtype they were checked against; None for a float product."""
    shown = prob.out_dtype
    if prob.dtype.kind not in "iu":
        for name, x in (("alpha", alpha), ("beta", beta)):
            try:
                f = float(x)
                # a finite number beyond any float (Decimal("1e400")) converts to inf
                too_large = math.isinf(f) and x != f
            except OverflowError:  # an int (10**400) or a Fraction beyond any float
                too_large = True
            except (ArithmeticError, ValueError) as exc:  # Decimal("sNaN")
                raise InvalidValueError(f"{name}={_brief(x)} is not a number a float can "
                                        f"hold ({exc})") from None
            if too_large:
                raise InvalidValueError(f"{name}={_brief(x)} is too large for a {shown.name} "
                                        "product (beyond any float)")
        return None
    # bool: alpha and beta scale the bool product on the host, in int64, as NumPy evaluates
    # (alpha * (a @ b) + beta * c) != 0 (tilegemm.api._scaled_bool); the kernel gets 1, 0
    checked = shown if shown.kind in "iu" else np.dtype(np.int64)
    info = np.iinfo(checked)
    values = []
    for name, x in (("alpha", alpha), ("beta", beta)):
        if isinstance(x, (int, np.integer)):
            v = int(x)
        else:
            try:  # exactly, whatever the type: Fraction(10**400) or Decimal("7") too
                v = int(x)
                whole = x == v
            except (ArithmeticError, ValueError, TypeError):  # inf, NaN, Decimal("sNaN")
                whole = False
            if not whole:
                raise InvalidTypeError(f"{name}={_brief(x)} must be an integer for a "
                                       f"{shown.name} product")
        if not info.min <= v <= info.max:
            what = (shown.name if shown == checked
                    else f"{checked.name}, in which a {shown.name} product is scaled")
            raise InvalidValueError(f"{name}={_brief(x)} does not fit in {what}")
        values.append(v)
    return values, checked


def size_text(nbytes: int) -> str:
    """A byte count as messages about memory give it: GiB, or MiB below one GiB."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _brief(x: Any) -> str:
    """``repr(x)``, shortened when it is long (an int of hundreds of digits)."""
    text = repr(x)
    return text if len(text) <= 40 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


def unknown_device(backend: str, index: Any, names: tuple[str, ...]) -> InvalidValueError:
    """The error for a ``device=`` that names no device here, listing the devices."""
    listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names)) or "none"
    hint = ("" if isinstance(index, int) and not isinstance(index, bool)
            else f"; device= takes an int index, not {type(index).__name__}")
    return InvalidValueError(f"unknown {backend} device {index!r}; devices here: {listing} "
                             f"(see 'tilegemm info'){hint}")


class Backend(ABC):
    """One kind of device and its arrays. Adding a backend: see docs/architecture.md.

    Every method that depends on the device takes the :class:`Target` that
    :meth:`target` made; ``target=None`` means the default device (kept so a caller with
    no device choice need not ask for one).
    """

    name: str = ""
    label: str = ""  # how messages name it ("OpenCL"); the name when empty
    array_kind: str = "host"
    accepts_device: bool = False  # whether device= may choose among several devices
    # GPU architectures the backend compiles its rungs for without a GPU (resource and SASS
    # reports: resource_report, cubin); () when it has no such toolchain.
    compile_archs: tuple[str, ...] = ()
    # Its rungs are Numba CUDA Python: numba's simulator runs them, so 'explain' can trace
    # their memory accesses, and numba compiles them to PTX.
    traceable: bool = False
    kernel_source: str = ""  # what its rungs are written in, for reports ("numba", "CUDA C")

    @abstractmethod
    def status(self) -> BackendStatus:
        """Probe once (cached by the implementation); never raises."""

    def device_names(self) -> tuple[str, ...]:
        """The devices ``device=`` indexes, by name (the error for a bad index lists them)."""
        return self.status().devices

    def target(self, device: int | None = None) -> Target:
        """The device a call runs on: ``device`` (an index into :meth:`device_names`) or the
        default one. Raises ValueError listing the devices for an index that is not there,
        and RuntimeError when the backend cannot run here."""
        status = self.status()
        if not status.usable:
            raise UnavailableError(f"backend {self.name!r} is not usable here: {status.reason}")
        if device is not None:
            names = self.device_names()
            if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or not (
                    0 <= int(device) < len(names)):
                raise unknown_device(self.label or self.name, device, names)
            device = int(device)
        return self._target(device)

    def _target(self, index: int | None) -> Target:
        """The Target of device ``index`` (already checked), or of the default device.

        Every real backend describes its device here; this fallback (no limits, the host
        clock) only serves a backend that has no device facts to give, such as a test's.
        """
        status = self.status()
        names = self.device_names()
        kind = "simulator" if status.simulated else "gpu" if status.accelerated else "cpu"
        return Target(self.name, names[index or 0] if names else self.name, kind, "",
                      Limits(threads_per_block=0), timer="perf_counter", index=index,
                      simulated=status.simulated, accelerated=status.accelerated)

    def target_for(self, operands: Sequence[Operand], device: int | None = None) -> Target:
        """The Target a call on ``operands`` runs on: where device arrays live (a backend
        with several devices overrides this), else ``device`` or the default."""
        return self.target(device)

    def device_details(self, target: Target) -> dict[str, Any]:
        """What a results file records about the device beyond the Target (driver...)."""
        return {}

    def resolve(self, spec: KernelSpec, params: Mapping[str, Any],
                target: Target | None = None) -> dict[str, int]:
        """The rung's full parameters on ``target``; a backend may start from defaults
        measured for that kind of device (``spec.device_defaults``) instead of the rung's."""
        defaults = spec.device_defaults.get((target or self.target()).kind, {})
        if defaults:
            merged = {**defaults, **params}
            if spec.is_valid(merged):
                return spec.resolve(merged)
        return spec.resolve(params)

    def check_limits(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                     target: Target | None = None) -> None:
        """Raise ValueError if the rung's threads or shared memory exceed ``target``."""
        check_block_limits(spec, params, dtype, target or self.target())

    def check_problem(self, operands: Sequence[Operand], prob: GemmProblem,
                      target: Target, out: Any = None) -> None:
        """Refuse a product this device cannot hold (its memory), before anything is
        allocated; :func:`tilegemm.api.decide` calls it, so ``plan`` refuses it too.
        ``out``: the caller's output array, if any."""

    def array_place(self, x: Any) -> Any:
        """What a decision for this backend's device array ``x`` depends on besides its
        shape, dtype and strides: the device it lives on, where the target is chosen by
        it (OpenCL). :mod:`tilegemm.fastpath_device` keys the decisions it remembers for
        device operands by it. None here: CUDA calls on device arrays are decided for GPU 0's
        target and run on the current device, whichever array it is."""
        return None

    @abstractmethod
    def run(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a: Operand, b: Operand, c: Operand | None, out: Any, alpha: Any, beta: Any,
        target: Target | None = None,
    ) -> Any:
        """Compute and return the result (``out`` if given), of the operands' array type."""

    def host_program(self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
                     target: Target) -> Callable[..., None] | None:
        """What later calls like this one may run directly (:mod:`tilegemm.fastpath`), or
        None, when every call takes the full path.

        The result is called as ``program(a3, b3, c3, alpha, beta)``: C-ordered NumPy arrays
        of ``prob.dtype``, A as (batch or 1, M, K), B as (batch or 1, K, N), and c3, the
        (batch, M, N) result it writes (a fresh array, or the caller's ``out``, sharing no
        memory with A or B); ``alpha`` one and ``beta`` zero in that dtype. (A program whose
        ``takes_transposed`` attribute is true is also given Fortran-ordered matrices and a
        flag saying which: the CPU's packing rung.) It is made once per remembered case,
        after a full call of the same problem on ``target`` ran, so the rung is compiled and
        every check has passed, and must do for the problem's shapes what :meth:`run` does
        with host operands."""
        return None

    def host_alpha_limit(self, program: Any, prob: GemmProblem) -> float:
        """The largest ``|alpha|`` for which ``program`` (:meth:`host_program`'s) computes
        ``alpha * A @ B + beta * c3`` itself, as :meth:`run` does for host operands (any
        beta finite in ``prob.dtype``; c3 holds ``c`` when beta is not zero, and is read
        then), so that a remembered ``gemm`` call can run it; 0.0 (the default) where it
        takes only alpha one and beta zero."""
        return 0.0

    def device_program(self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
                       target: Target, ops: Sequence[Operand]) -> Callable[..., Any] | None:
        """What later plain calls like this one on device arrays may run directly
        (:mod:`tilegemm.fastpath_device`), or None, when they take the full path.

        The result is called as ``program(a, b, poison)`` with the caller's device arrays
        (of the layout, dtype and device of the described ``ops`` just run) and returns
        the product as :meth:`run` would (``poison``: NaN written first, as under
        ``TILEGEMM_POISON``), or None (having launched nothing) where that call must take
        the full path after all. Its ``key_of(x)`` gives what a case depends on
        of an operand ``x``, read cheaply from the array's own attributes, or None. It is
        made once per case, right after a full call of ``prob`` on ``target`` ran with
        alpha one, beta zero, no ``c`` and no ``out``."""
        return None

    def prepare(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a3: np.ndarray, b3: np.ndarray, target: Target | None = None,
    ) -> Prepared:
        """Copy (batch|1, M, K) and (batch|1, K, N) host operands to the device once and
        return launch/fetch/elapsed closures over them (alpha=1, beta=0)."""
        raise NotImplementedError(f"backend {self.name} cannot prepare benchmarks yet")

    def synchronize(self) -> None:
        """Wait for queued work (timing uses this); host backends have nothing to wait for."""

    def resources(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                  target: Target) -> tuple[int, int] | None:
        """(registers per thread, bytes spilled) of the compiled rung, where the backend's
        toolchain can tell without running it (the tuner rejects spilling candidates)."""
        if not self.compile_archs:
            return None
        arch = target.arch if target.arch in self.compile_archs else self.compile_archs[-1]
        res = self.resource_report(spec, params, dtype, arch)
        return None if res is None else (res.registers, res.spills)

    def cubin(self, spec: KernelSpec, params: dict[str, int], dtype: str, arch: str) -> bytes:
        """The rung's machine code for ``arch`` (SASS analysis); needs no GPU."""
        raise UnavailableError(f"{self.label or self.name} rungs have no cubin")

    def describe_devices(self) -> Any:
        """A rich table of this backend's devices and their limits for ``tilegemm info``, or
        None when a backend has nothing to add to its status line."""
        return None

    def results_prefix(self, info: Mapping[str, Any]) -> str:
        """What starts a results file's name before the device's own (``opencl-pocl-``),
        from the device details a results file recorded (``bench.environment``)."""
        return ""

    def resource_report(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                        arch: str) -> Any:
        """What the compiler allocated for the rung built for ``arch`` ("sm_90") with no
        device present (an ``analysis.resources.Resources``: registers, spills, stack, shared
        memory), or None where the backend's toolchain cannot tell (``tilegemm kernels
        --resources``)."""
        return None

    def cache_flusher(self, target: Target | None = None) -> Callable[[], None] | None:
        """A function that evicts the device's cache between timed launches, or None."""
        return None


def shared_limit(spec: KernelSpec, limits: Limits) -> tuple[int, str]:
    """The shared memory a block of ``spec`` may use under ``limits`` (0: no limit), and
    how to name that limit in a message: a rung with dynamic shared memory may use the
    device's opt-in maximum, any other rung only what a kernel may declare statically."""
    if spec.dynamic_smem and limits.shared_optin_per_block:
        return limits.shared_optin_per_block, " (dynamic shared memory, opted in)"
    return limits.shared_per_block, ""


def check_block_limits(spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                       target: Target) -> None:
    """The rung's declared threads and shared memory per block against ``target.limits``,
    and its parameters against the dtype (``KernelSpec.dtype_check``)."""
    why = spec.dtype_check(params, np.dtype(dtype)) if spec.dtype_check else None
    if why:
        raise InvalidValueError(f"{spec.name}: {why}")
    limits = target.limits
    if spec.threads is not None and limits.threads_per_block and (
            spec.threads(params) > limits.threads_per_block):
        raise InvalidValueError(
            f"{spec.name}: {spec.threads(params)} threads per block exceed the limit of "
            f"{limits.threads_per_block} on {target.name}")
    limit, kind = shared_limit(spec, limits)
    if spec.smem is not None and limit:
        need = spec.smem(params, np.dtype(dtype).itemsize)
        if need > limit:
            raise InvalidValueError(
                f"{spec.name}: needs {need} bytes of shared memory per block, more than the "
                f"{limit}-byte limit{kind} on {target.name}"
                + _smaller_shared(spec, params, np.dtype(dtype).itemsize, need))


def _smaller_shared(spec: KernelSpec, params: Mapping[str, int], itemsize: int,
                    need: int) -> str:
    """"; choose a smaller X or Y" naming the rung's own parameters whose next smaller
    choice needs less shared memory (the rung's ``smem`` says which), so the advice fits
    the rung: STAGES, BM and BN for wgmma, TILE for shared."""
    if spec.smem is None:
        return ""
    names = []
    for p in spec.params:
        value = params.get(p.name, p.default)
        # 0 may stand for a choice the rung makes itself (wgmma's STAGES=0: the deepest
        # ring that fits): then any explicit choice may be the smaller one
        smaller = [c for c in p.choices if c < value] if value else [
            c for c in p.choices if c]
        if not smaller:
            continue
        try:
            if spec.smem({**params, p.name: max(smaller) if value else min(smaller)},
                         itemsize) < need:
                names.append(p.name)
        except (KeyError, ValueError, ZeroDivisionError):  # a combination smem cannot size
            continue
    if not names:
        return ""
    shown = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"; choose a smaller {shown}"
