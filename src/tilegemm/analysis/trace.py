"""Trace a CUDA kernel's own memory accesses by running it on numba's CUDA simulator.

Why trace rather than model: a formula per kernel is a second copy of the kernel that can
drift from it, and it is exactly where hand analyses go wrong (the optimisation note counts its
shared kernel's bank conflicts by intuition). Here the counts come from executing the rung's real
Python code: every array the kernel touches is replaced by a :class:`TracedArray` that
records each element access — which thread, which instruction (source site and dynamic
instance), which byte address, how wide, load or store — and
:mod:`tilegemm.analysis.memory` groups those records into warp requests, sectors and
bank wavefronts.

How it hooks into the simulator (numba-cuda 0.30, ``numba.cuda.simulator``):

- ``FakeCUDAKernel`` normally wraps NumPy arguments in ``FakeCUDAArray``; objects it does not
  recognise pass through unchanged, so a :class:`TracedArray` reaches the kernel as is.
- Rather than launching through ``FakeCUDAKernel.__call__`` (which runs every block), the
  tracer builds the same ``FakeCUDAModule`` (with ``gridDim`` = the full launch grid) and
  runs chosen blocks with the simulator's own ``BlockManager``: each block's threads are
  Python threads that meet at ``syncthreads``. So a sample of blocks can be traced with
  the grid-stride loops seeing the real grid.
- ``cuda.shared.array`` is served by :class:`TracedShared`, which hands out traced arrays
  in a shared address space (each allocation 128-byte aligned; a common offset does not
  change which accesses of one array share a bank). Dynamic shared memory
  (``cuda.shared.array(0, ...)``, sized by the launch) is one traced buffer too, every
  such call a view of the same bytes, as on the GPU.
- The tensor-core and asynchronous-copy instructions (``cp.async``, ``ldmatrix``, the
  offset-addressed shared loads; ``tilegemm.kernels.cuda._tensorcore``) have Python
  stand-ins under the simulator that move whole rows of memory. Given a traced array, a
  stand-in reports each access as the instruction makes it (:meth:`TracedArray.trace_access`:
  one access of the instruction's width per thread, e.g. 16 bytes for a ``cp.async`` or an
  ``ldmatrix`` row) and then works on the untraced data, so the counts are those of the
  compiled instruction, not of the stand-in's element copies.
- ``cuda.local.array`` (per-thread accumulators) is left alone: such arrays live in
  registers once unrolled; spills are what the resource report counts.

The simulator must be selected before ``numba.cuda`` is first imported
(``NUMBA_ENABLE_CUDASIM=1``), so a process that also compiles PTX runs this module as a
subprocess: ``python -m tilegemm.analysis.trace ...`` prints JSON
(:func:`trace_in_subprocess`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import linecache
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilegemm import simulator
from tilegemm.analysis.memory import (
    GLOBAL,
    RECORD,
    SHARED,
    WARP,
    Counts,
    SiteInfo,
    count_block,
    tidy,
)
from tilegemm.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnavailableError,
    UsageError,
)

GLOBAL_ALIGN = 256  # cudaMalloc returns 256-byte aligned allocations
SHARED_ALIGN = 128
VECTOR_BYTES = 16

# The fast rungs index arrays through small helpers (scalar and 128-bit vector load/store,
# tilegemm.kernels.cuda._access) and the tensor-core rungs through instruction stand-ins
# (_tensorcore); under the simulator those are Python functions, so the tracer looks
# through them to the kernel's own line.
_KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels" / "cuda"
_ACCESS_FILE = str(_KERNELS_DIR / "_access.py")
_LOOK_THROUGH = frozenset({_ACCESS_FILE, str(_KERNELS_DIR / "_tensorcore.py"),
                           str(_KERNELS_DIR / "_wgmma.py")})
_VECTOR_HELPERS = frozenset({"_py_vload", "_py_vstore"})
# Dynamic shared memory's place in the traced shared address space: apart from the static
# allocations, and a multiple of 128 bytes, so its banks are those of its own offsets.
DYNAMIC_SHARED_BASE = 1 << 24

Block = tuple[int, int, int]

# What the trace of a rung leaves out, said in its report. wgmma's tensor core reads its
# operands from shared memory itself, through matrix descriptors, asynchronously: no
# thread issues those reads (the simulator stand-in reads the bytes when the product is
# waited for), so they are not requests to count. Everything its threads do is counted.
NOT_COUNTED: dict[str, str] = {
    "wgmma": "the operands wgmma itself reads from shared memory (the tensor core reads "
             "them through matrix descriptors; no thread issues those reads): the shared "
             "loads below are the threads' own only",
}


class _ThreadState(threading.local):
    """Per simulated thread: its record list and per-site instance counters."""

    records: list[tuple[int, int, int, int, int]] | None = None
    instances: dict[int, int]
    barriers: list[int]  # one-element counter, shared with the tracer's block list
    vector: Any = None   # the vector-helper frame whose first element was recorded
    tid: int = 0


class Tracer:
    """Collects the accesses of the blocks being run and the table of instruction sites."""

    def __init__(self) -> None:
        self.sites: dict[tuple[Any, ...], int] = {}
        self.infos: dict[int, SiteInfo] = {}
        self._spans: dict[tuple[Any, int], tuple[Any, ...]] = {}
        self._lock = threading.Lock()
        self._state = _ThreadState()
        self._block_threads: list[tuple[list[tuple[int, int, int, int, int]], list[int]]] = []

    # -- called from simulated threads -------------------------------------------------
    def record(self, frame: Any, array: TracedArray, addr: int, store: bool,
               size: int | None = None) -> None:
        """One access by the calling simulated thread at byte ``addr`` of ``array``'s space.

        ``size`` defaults to the element size; an instruction stand-in gives its own width.
        A ``size`` of 0 is an instruction this thread executed without touching memory (a
        ``cp.async`` of no source bytes): it counts as an instance of the site, so the
        thread's later instances still line up with its warp's, but records nothing.
        """
        st = self._state
        if st.records is None:
            self._start_thread(st)
        if size is None:
            size = array.itemsize
        if frame.f_code.co_filename in _LOOK_THROUGH:
            # Through a rung's access helper or instruction stand-in: attribute the access
            # to the kernel line that called it; a vector helper's W element accesses are
            # one 128-bit access, as the compiled kernel issues it.
            vector = None
            while frame.f_code.co_filename in _LOOK_THROUGH:
                if (frame.f_code.co_filename == _ACCESS_FILE
                        and frame.f_code.co_name in _VECTOR_HELPERS):
                    vector = frame
                frame = frame.f_back
            if vector is not None:
                if st.vector is vector:
                    return  # a later element of the vector just recorded
                st.vector = vector
                size = VECTOR_BYTES
        code, lasti = frame.f_code, frame.f_lasti
        span = self._spans.get((code, lasti))
        if span is None:
            # The instruction's source span identifies the site. (Not f_lasti itself: once
            # Python 3.11 specialises a subscript, f_lasti points past its inline cache.)
            span = self._spans[(code, lasti)] = list(code.co_positions())[lasti // 2]
        key = (code, span, array.label, store)
        site = self.sites.get(key)
        if site is None:
            site = self._new_site(key, code, span, frame.f_lineno, array, store)
        inst = st.instances.get(site, 0)
        st.instances[site] = inst + 1
        if size:
            st.records.append((st.tid, site, inst, addr, size))

    def _start_thread(self, st: _ThreadState) -> None:
        thread = threading.current_thread()
        tid = getattr(thread, "thread_id", None)
        if tid is None:
            raise RuntimeError("traced arrays may only be indexed inside a simulated kernel")
        st.tid = int(tid)
        st.instances = {}
        st.records = []
        st.barriers = [0]
        self._block_threads.append((st.records, st.barriers))  # atomic under the GIL

    def barrier(self) -> None:
        """Count one ``syncthreads`` by the calling simulated thread."""
        st = self._state
        if st.records is None:
            self._start_thread(st)
        st.barriers[0] += 1

    def _new_site(self, key: tuple[Any, ...], code: Any, span: tuple[Any, ...], lineno: int,
                  array: TracedArray, store: bool) -> int:
        with self._lock:
            site = self.sites.get(key)
            if site is not None:
                return site
            site = len(self.sites)
            line, end_line, col, end_col = span
            line = line or lineno
            src = linecache.getline(code.co_filename, line)
            text = src[col:end_col] if (src and col is not None and end_col is not None
                                        and end_line == line) else src.strip()
            where = f"{Path(code.co_filename).name}:{line}:{(col or 0) + 1}"
            self.infos[site] = SiteInfo(site, array.space, store, array.label, where, text)
            self.sites[key] = site
            return site

    # -- called by the launcher between blocks -----------------------------------------
    def take_block(self) -> tuple[np.ndarray, int]:
        """The records of the block just run and its barrier count (then forget them).

        A block's barrier count is the most ``syncthreads`` any of its threads executed
        (all threads of a correct kernel execute the same number).
        """
        rows = [r for records, _ in self._block_threads for r in records]
        barriers = max((b[0] for _, b in self._block_threads), default=0)
        self._block_threads = []
        arr = np.array(rows, dtype=RECORD) if rows else np.zeros(0, dtype=RECORD)
        return arr, barriers


class TracedArray:
    """A NumPy array whose element reads and writes are recorded with their byte address.

    Supports what kernels do with arrays: ``shape``/``ndim``/``size``/``dtype``/``strides``,
    integer indexing (negative indices wrap, as in numba) and basic slicing (a view keeps
    its address offset).
    """

    __slots__ = ("_data", "_tracer", "base", "label", "space", "itemsize")

    def __init__(self, data: np.ndarray, tracer: Tracer, base: int, label: str, space: int):
        self._data = data
        self._tracer = tracer
        self.base = base
        self.label = label
        self.space = space
        self.itemsize = data.dtype.itemsize

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def strides(self) -> tuple[int, ...]:
        return self._data.strides

    def __len__(self) -> int:
        return len(self._data)

    def _address(self, idx: Any) -> int | None:
        """Byte address of a single element, or None when ``idx`` selects a sub-array."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) != self._data.ndim:
            return None
        off = self.base
        for i, n, s in zip(idx, self._data.shape, self._data.strides):
            if isinstance(i, slice) or i is Ellipsis or i is None:
                return None
            i = int(i)
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"index {i} out of bounds for axis of size {n} "
                                 f"in {self.label}")
            off += i * s
        return off

    def _view(self, sub: np.ndarray) -> TracedArray:
        delta = (sub.__array_interface__["data"][0]
                 - self._data.__array_interface__["data"][0])
        return TracedArray(sub, self._tracer, self.base + delta, self.label, self.space)

    def __getitem__(self, idx: Any) -> Any:
        addr = self._address(idx)
        if addr is None:
            return self._view(self._data[idx])
        self._tracer.record(sys._getframe(1), self, addr, False)
        return self._data[idx]

    def __setitem__(self, idx: Any, value: Any) -> None:
        addr = self._address(idx)
        if addr is None:
            raise TypeError(f"slice assignment to {self.label} cannot be traced per element")
        self._tracer.record(sys._getframe(1), self, addr, True)
        self._data[idx] = value

    # -- for the simulator stand-ins of instructions that move whole rows ------------------
    @property
    def untraced(self) -> np.ndarray:
        """The data itself: a stand-in moves it after reporting the access it makes."""
        return self._data

    def trace_access(self, offset: int, size: int, store: bool) -> None:
        """Record one access of ``size`` bytes at byte ``offset`` from this array's start,
        as one instruction of the calling thread (``size`` 0: executed, nothing moved)."""
        if size and not 0 <= offset <= self._data.nbytes - size:
            raise IndexError(f"{size}-byte access at byte {offset} outside {self.label} "
                             f"({self._data.nbytes} bytes)")
        self._tracer.record(sys._getframe(1), self, self.base + int(offset), store, int(size))


class TracedShared:
    """Replaces the simulator's ``cuda.shared`` so shared arrays are traced too.

    Like the simulator's own, allocations are identified by their call site (one
    allocation per source line) and live for the whole launch; blocks run one at a time.
    """

    def __init__(self, tracer: Tracer, dynamic_bytes: int = 0) -> None:
        self._tracer = tracer
        self._allocations: dict[tuple[str, int], TracedArray] = {}
        self._next = 0
        self._lock = threading.Lock()
        # the launch's dynamic shared memory: one buffer, viewed as each call's dtype
        self._dynamic = np.zeros(dynamic_bytes, np.uint8)
        self._dynamic_views: dict[tuple[str, np.dtype], TracedArray] = {}

    def array(self, shape: Any, dtype: Any, alignment: Any = None) -> TracedArray:
        from numba.cuda import types
        from numba.cuda.np import numpy_support

        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        if shape == 0:
            return self._dynamic_array(np.dtype(dtype), caller)
        key = (caller.f_code.co_filename, caller.f_lineno)
        arr = self._allocations.get(key)
        if arr is None:
            # Every thread of the block calls this at once: without the lock two threads
            # could each create "the" array and the block would not share it.
            with self._lock:
                arr = self._allocations.get(key)
                if arr is None:
                    data = np.zeros(shape, dtype)
                    label = _assigned_name(caller.f_code.co_filename, caller.f_lineno)
                    arr = TracedArray(data, self._tracer, self._next, label, SHARED)
                    self._next += -(-data.nbytes // SHARED_ALIGN) * SHARED_ALIGN
                    self._allocations[key] = arr
        return arr

    def _dynamic_array(self, dtype: np.dtype, caller: Any) -> TracedArray:
        """The dynamic shared buffer as ``dtype`` elements (as many as fit), at
        :data:`DYNAMIC_SHARED_BASE`; labelled by the name the kernel gives it."""
        if not self._dynamic.size:
            raise ValueError("the kernel asks for dynamic shared memory but the launch "
                             "gives none (trace_launch's dynamic_shared=)")
        label = _assigned_name(caller.f_code.co_filename, caller.f_lineno)
        key = (label, dtype)
        arr = self._dynamic_views.get(key)
        if arr is None:
            with self._lock:
                arr = self._dynamic_views.get(key)
                if arr is None:
                    count = self._dynamic.size // dtype.itemsize
                    data = np.frombuffer(self._dynamic.data, dtype=dtype, count=count)
                    arr = TracedArray(data, self._tracer, DYNAMIC_SHARED_BASE, label, SHARED)
                    self._dynamic_views[key] = arr
        return arr

    @property
    def nbytes(self) -> int:
        return (sum(a._data.nbytes for a in self._allocations.values())
                + (self._dynamic.size if self._dynamic_views else 0))


def _assigned_name(filename: str, line: int) -> str:
    """``sA`` for a line ``sA = cuda.shared.array(...)`` (the label shown in reports)."""
    src = linecache.getline(filename, line)
    m = re.match(r"\s*([A-Za-z_]\w*)\s*=", src)
    return m.group(1) if m else f"shared@{Path(filename).name}:{line}"


@dataclass
class Trace:
    """What one traced launch produced: site table and per-block counts."""

    grid: Block
    block: Block
    infos: dict[int, SiteInfo]
    per_block: dict[Block, Counts] = field(default_factory=dict)
    shared_bytes: int = 0
    seconds: float = 0.0


def _simulator_kernel_fn(kernel: Any) -> Callable[..., Any]:
    """The Python function of a simulator kernel; a clear error for a real (jitted) one."""
    if "simulator" not in type(kernel).__module__:
        raise UnavailableError("tracing needs numba's CUDA simulator: set NUMBA_ENABLE_CUDASIM=1 "
                           "before numba.cuda is imported (or use trace_in_subprocess)")
    return kernel.py_func


def trace_launch(kernel: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
                 *, blocks: Iterable[Block] | None = None,
                 labels: Sequence[str] | None = None, dynamic_shared: int = 0) -> Trace:
    """Run ``kernel[grid, block](*args)`` on the simulator, tracing the chosen blocks.

    ``kernel`` is a simulator kernel (what ``cuda.jit`` returns under
    ``NUMBA_ENABLE_CUDASIM=1``); any NumPy array among ``args`` becomes a traced global
    array named after the kernel's parameter (or ``labels``). ``blocks`` defaults to the
    whole grid; arrays are updated in place, as a launch would. ``dynamic_shared`` is the
    launch's dynamic shared memory in bytes (``kernel[grid, block, stream, bytes]``).
    """
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, swapped_cuda_module

    fn = _simulator_kernel_fn(kernel)
    grid3 = tuple(int(g) for g in (*grid, 1, 1)[:3])
    block3 = tuple(int(b) for b in (*block, 1, 1)[:3])
    names = list(labels or inspect.signature(fn).parameters)
    tracer = Tracer()
    traced_args: list[Any] = []
    next_base = GLOBAL_ALIGN  # keep address 0 unused
    for i, arg in enumerate(args):
        if isinstance(arg, np.ndarray):
            label = names[i] if i < len(names) else f"arg{i}"
            traced_args.append(TracedArray(arg, tracer, next_base, label, GLOBAL))
            next_base += -(-max(arg.nbytes, 1) // GLOBAL_ALIGN) * GLOBAL_ALIGN
        else:
            traced_args.append(arg)

    fake = FakeCUDAModule(grid3, block3, int(dynamic_shared))
    shared = TracedShared(tracer, int(dynamic_shared))
    fake._shared = shared
    simulated_sync = fake.syncthreads

    def syncthreads() -> None:
        tracer.barrier()
        simulated_sync()

    fake.syncthreads = syncthreads  # type: ignore[method-assign]
    warps = -(-int(np.prod(block3)) // WARP)
    chosen = list(blocks) if blocks is not None else list(np.ndindex(*grid3))
    result = Trace(grid=grid3, block=block3, infos=tracer.infos)
    t0 = time.perf_counter()
    with simkernel._push_kernel_context(fake), swapped_cuda_module(fn, fake):
        for gp in chosen:
            gp = tuple(int(v) for v in gp)
            simkernel.BlockManager(fn, grid3, block3, False).run(gp, *traced_args)
            records, barriers = tracer.take_block()
            counts = count_block(records, tracer.infos)
            counts.blocks, counts.barriers, counts.warp_barriers = 1, barriers, barriers * warps
            result.per_block[gp] = counts
    result.seconds = time.perf_counter() - t0
    result.shared_bytes = shared.nbytes
    return result


# -- tracing a registered rung ----------------------------------------------------------

def operands(m: int, n: int, k: int, batch: int, dtype: np.dtype,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Non-zero random A (batch, M, K), B (batch, K, N) and a NaN-poisoned C (batch, M, N)."""
    rng = np.random.default_rng(seed)
    if dtype.kind in "iu":
        a = rng.integers(1, 5, (batch, m, k)).astype(dtype)
        b = rng.integers(1, 5, (batch, k, n)).astype(dtype)
        c = np.full((batch, m, n), -7, dtype)
    else:
        a = rng.uniform(0.5, 1.5, (batch, m, k)).astype(dtype)
        b = rng.uniform(0.5, 1.5, (batch, k, n)).astype(dtype)
        c = np.full((batch, m, n), np.nan, dtype)
    return a, b, c


def trace_rung(kernel: str, m: int, n: int, k: int, *, params: Mapping[str, int] | None = None,
               dtype: str = "float32", batch: int = 1, beta: float = 0.0,
               samples: int = 2, full: bool | None = None, full_limit: int = 16,
               backend: str = "cuda") -> dict[str, Any]:
    """Trace one registered CUDA rung on an M×N×K problem; return a JSON-ready report.

    The whole grid is traced when it has at most ``full_limit`` blocks (or ``full=True``);
    otherwise :mod:`tilegemm.analysis.sampling` picks up to ``samples`` blocks of each
    class (interior, last column of blocks, last row, corner) and scales their counts by
    the size of the class. A full trace also checks the result against float64 NumPy.
    """
    from tilegemm import registry
    from tilegemm.analysis.sampling import combine, plan_blocks
    from tilegemm.backends import get_backend
    from tilegemm.launch import ceil_div

    if not get_backend(backend).traceable:
        raise InvalidValueError(
            f"explain traces CUDA rungs only (got backend {backend!r}); the same "
            "kernels' OpenCL/CPU versions are not traced")
    for name, v in (("m", m), ("n", n), ("k", k), ("batch", batch)):
        if v < 0 or (name == "batch" and v < 1):
            raise InvalidValueError(f"{name} must be >= {1 if name == 'batch' else 0}, got {v}")
    spec = registry.get(kernel, backend)
    np_dtype = np.dtype(dtype)
    if not spec.supports(np_dtype):
        raise InvalidTypeError(
            f"{spec.name} supports {', '.join(spec.dtypes)}, not {np_dtype.name}")
    resolved = spec.resolve(params)
    program = spec.program(resolved, np_dtype)
    a, b, c = operands(m, n, k, batch, np_dtype)
    c0 = np.where(np.isnan(c), 0, c).astype(np_dtype) if np_dtype.kind == "f" else c.copy()
    if beta != 0:
        c[...] = c0 = np.ones_like(c)
    grid = program.grid(batch, m, n)
    tile = getattr(program.grid, "tile", None)  # tiles numbered in x: class them by tile
    flat = None if tile is None else (ceil_div(m, tile[0]), ceil_div(n, tile[1]),
                                      resolved.get("GROUP_M", 1))
    plan = plan_blocks(grid, samples=samples, full=full, full_limit=full_limit, flat=flat)
    # bfloat16 operands reach the kernel as their 16-bit patterns, with float32 scalars
    # (the program's arg_types, as the backend launches it); views, so C is still filled.
    elem, scalar = program.arg_types or (np_dtype.name, np_dtype.name)
    alpha = np.dtype(scalar).type(1)
    beta_v = np.dtype(scalar).type(beta)
    args = [x.view(elem) for x in (*program.kernel_operands(a, b), c)]
    trace = trace_launch(program.kernel, grid, program.block, [*args, alpha, beta_v],
                         blocks=plan.blocks, labels=["A", "B", "C", "alpha", "beta"],
                         dynamic_shared=program.dynamic_smem)
    counts = combine(trace.per_block, plan)
    verified = None
    if plan.full:
        from tilegemm.precision import tolerance_eps
        from tilegemm.reference import assert_close

        try:  # a tensor-core rung's reduced precision (TF32) widens the tolerance
            assert_close(c, a, b, beta=float(beta), c=c0 if beta else None,
                         what=f"traced {spec.name}",
                         eps=tolerance_eps(spec, resolved, np_dtype))
            verified = True
        except AssertionError:
            verified = False
    sites = []
    for sid, info in sorted(trace.infos.items()):
        sc = counts.sites.get(sid)
        if sc is None:
            continue
        sites.append({"id": sid, "kind": info.kind, "array": info.array, "where": info.where,
                      "text": info.text, **sc.as_dict()})
    totals = {}
    for name, space, store in (("global_load", GLOBAL, False), ("global_store", GLOBAL, True),
                               ("shared_load", SHARED, False), ("shared_store", SHARED, True)):
        totals[name] = counts.total(trace.infos, space, store).as_dict()
    launch = {"blocks": counts.blocks, "barriers_per_block": counts.barriers / counts.blocks
              if counts.blocks else 0, "warp_barriers": tidy(counts.warp_barriers)}
    return {
        "launch": launch,
        "kernel": spec.name, "backend": backend, "params": resolved, "dtype": np_dtype.name,
        "itemsize": np_dtype.itemsize, "m": m, "n": n, "k": k, "batch": batch, "beta": beta,
        "grid": list(trace.grid), "block": list(trace.block),
        "threads_per_block": int(np.prod(trace.block)),
        "traced_shared_bytes": trace.shared_bytes,
        "sampling": plan.describe(),
        "sites": sites, "totals": totals, "verified": verified,
        "not_counted": NOT_COUNTED.get(spec.name) if backend == "cuda" else None,
        "trace_seconds": round(trace.seconds, 3),
    }


# -- the subprocess entry point ---------------------------------------------------------

def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tilegemm.analysis.trace",
                                description="trace a CUDA rung on the simulator; prints JSON")
    p.add_argument("kernel")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--full", action="store_true")
    p.add_argument("--full-limit", type=int, default=16)
    p.add_argument("--params", default="{}", help="JSON object of kernel parameters")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _arg_parser().parse_args(argv)
    try:
        out = trace_rung(args.kernel, args.m, args.n, args.k, params=json.loads(args.params),
                         dtype=args.dtype, batch=args.batch, beta=args.beta,
                         samples=args.samples, full=args.full or None,
                         full_limit=args.full_limit, backend=args.backend)
    except (ValueError, TypeError) as exc:
        kind = (("InvalidTypeError" if isinstance(exc, TypeError) else "InvalidValueError")
                if isinstance(exc, UsageError) else type(exc).__name__)
        print(json.dumps({"error": str(exc), "type": kind}))
        return 2
    print(json.dumps(out))
    return 0


def trace_in_subprocess(kernel: str, m: int, n: int, k: int, *,
                        params: Mapping[str, int] | None = None, dtype: str = "float32",
                        batch: int = 1, beta: float = 0.0, samples: int = 2,
                        full: bool = False, full_limit: int = 16, backend: str = "cuda",
                        timeout: float | None = None) -> dict[str, Any]:
    """:func:`trace_rung` in a child Python with ``NUMBA_ENABLE_CUDASIM=1`` (JSON back).

    Use this from any process that has imported (or will import) the real ``numba.cuda``,
    e.g. to compile PTX as well: the simulator cannot be switched on after that import.
    """
    env = dict(os.environ, **{simulator.ENV_VAR: "1"})
    src = str(Path(__file__).resolve().parents[2])  # .../src, so an uninstalled tree works
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "tilegemm.analysis.trace", kernel, "--backend", backend,
           "--m", str(m), "--n", str(n), "--k", str(k), "--batch", str(batch),
           "--dtype", dtype, "--beta", repr(float(beta)), "--samples", str(samples),
           "--full-limit", str(full_limit), "--params", json.dumps(dict(params or {}))]
    if full:
        cmd.append("--full")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, dict):
        raise RuntimeError(f"the tracer failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    if "error" in out:
        # the caller's mistake as the library's own errors; anything else is the tracer's
        usage = {"InvalidTypeError": InvalidTypeError, "InvalidValueError": InvalidValueError}
        kind = out.get("type")
        if kind in usage:
            raise usage[kind](out["error"])
        raise RuntimeError(f"the tracer failed ({kind}: {out['error']})")
    return out


if __name__ == "__main__":  # pragma: no cover - exercised through trace_in_subprocess
    sys.exit(main())
