"""What an OpenCL rung's ``build`` returns: its OpenCL C source, defines and launch geometry.

Kept free of pyopencl imports (rung modules import it at top level, and building a
description needs no device). The backend compiles the source once per (source, defines,
device) and keeps the program in memory; the driver's on-disk cache (PoCL's kernel cache,
kept in tilegemm's cache directory) lets a second process skip the compiler too.

Every OpenCL rung has the same kernel, named ``gemm``, with the same arguments::

    gemm(int M, int N, int K,
         global const T *A, long a_off, long a_bs,    // A (batch|1, M, K), row-major
         global const T *B, long b_off, long b_bs,    // B (batch|1, K, N), row-major
         global T *C, long c_off,                     // C (batch, M, N), row-major
         T alpha, T beta)

Offsets and batch strides are in elements; a batch stride of 0 shares one matrix across
the batch (the broadcast convention of :mod:`tilegemm.problem`). ``C`` is read only when
``beta != 0``. The batch index is the work-group id in dimension 2.

One exception to "row-major": a program with ``panels`` set is launched, for the products
its ``packs`` accepts, as its ``with_panels`` variant, which reads A and B in panels that
the backend packs first (``pack_panels`` in ``_layout.cl``: ``panels[0]`` rows of A,
``panels[1]`` columns of B, each panel K-major and zero-padded); ``a_off`` and ``b_off``
are then 0 and the batch strides those of the packed arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

import numpy as np

from tilegemm.launch import ceil_div

KERNEL_NAME = "gemm"
PACKAGE = "tilegemm.kernels.opencl"
PRELUDE = "_prelude.cl"
# work-groups that must read each panel of A or B before packing them pays (see packs)
PANEL_MIN_READS = 4
# rows this many bytes apart (or a multiple) fall in the same few sets of a CPU's caches:
# the size of one way of the L1 data cache on the x86 CPUs measured (see packs)
PANEL_ALIAS_BYTES = 4096
# ... and a strip of B that many rows deep no longer fits in those sets (see packs)
PANEL_ALIAS_ROWS = 512

# OpenCL C spelling of each dtype a rung may be built for.
C_TYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long"}


@cache
def read_source(filename: str) -> str:
    """An OpenCL C file shipped as package data beside the rung modules."""
    return resources.files(PACKAGE).joinpath(filename).read_text(encoding="utf-8")


def type_defines(dtype: np.dtype, vector_width: int = 1) -> dict[str, str]:
    """-D defines naming the element type (and its vector type) for the prelude."""
    dtype = np.dtype(dtype)
    scalar = C_TYPES[dtype.name]
    defines = {"TG_T": scalar, "TG_VW": str(vector_width),
               "TG_VT": scalar if vector_width == 1 else f"{scalar}{vector_width}"}
    if dtype.name == "float64":
        defines["TG_FP64"] = "1"
    if dtype.kind in "iu":
        defines["TG_INT"] = "1"
    return defines


@dataclass(frozen=True)
class OpenCLProgram:
    """One rung at one parameter set and dtype, ready to compile for any device.

    ``local`` is the work-group size (dimension 0 first, as OpenCL counts); ``tile`` is the
    block of C one work-group computes, as (columns along dimension 0, rows along dimension
    1) for kernels that map dimension 0 to columns, or (rows, columns) for the naive rung:
    the global size is the tile count per dimension times ``local``, and the batch.
    """

    rung: str
    filename: str
    defines: tuple[tuple[str, str], ...]
    local: tuple[int, int]
    tile: tuple[int, int]
    dim0_is_row: bool = False  # only the original example's naive mapping puts rows in dimension 0
    local_mem: int = 0  # bytes of __local memory per work-group
    panels: tuple[int, int] = (0, 0)  # rows of A, columns of B per panel, when packed
    vector_width: int = 1  # elements per vector access (VW)

    @property
    def source(self) -> str:
        # the #line directive makes the compiler's messages name the rung's own file and
        # line, not a position in the prelude and the file joined together
        return (read_source(PRELUDE) + f'\n#line 1 "{self.filename}"\n'
                + read_source(self.filename))

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(f"-D{k}={v}" for k, v in self.defines)

    def global_size(self, batch: int, m: int, n: int) -> tuple[int, int, int]:
        """NDRange for a (batch, M, N) result: whole work-groups covering every element."""
        extent0, extent1 = (m, n) if self.dim0_is_row else (n, m)
        return (
            max(1, ceil_div(extent0, self.tile[0])) * self.local[0],
            max(1, ceil_div(extent1, self.tile[1])) * self.local[1],
            max(1, batch),
        )

    @property
    def local_size(self) -> tuple[int, int, int]:
        return (self.local[0], self.local[1], 1)

    def packs(self, m: int, n: int, k: int, itemsize: int,
              b_offsets: tuple[int, ...] = ()) -> bool:
        """Whether an M x N x K product reads A and B packed in panels.

        Only where the kernel can (``panels``); where at least ``PANEL_MIN_READS``
        work-groups read each panel (each row panel of A is read by every column block of
        C, each column panel of B by every row block), so that the pass over A and B is
        paid back; and where reading them in place has a known cost that packing removes:

        - B's rows cannot be read as aligned vectors (N, or one of ``b_offsets``, B's
          offset and batch stride in elements, not a multiple of the vector width): in
          place, B is read element by element (at 1000³ in
          ``float16``, 31 GFLOP/s in place against 163 packed on an AVX-512 Xeon);
        - B's rows are a multiple of ``PANEL_ALIAS_BYTES`` apart (N = 1024, 2048... in
          float32) and there are at least ``PANEL_ALIAS_ROWS`` of them: the rows of a
          work-item's strip then fall in the same few cache sets, more than those sets
          hold, and every row block reads the strip again from L3 or memory (1024³: 66
          GFLOP/s in place, 145 packed, for the CPU default tile). A's rows alias too
          when K is such a multiple, but a work-item reads only TM of them at a time,
          which the caches' ways hold: making K 1040 instead of 1024 gained 3 %, N 30 %.

        Otherwise packing only costs: 256³ ran at 0.6x, a 2048 x 2048 x 128 product
        (short strips) at 0.8x and a 1000³ product with aligned rows at 0.9x their
        in-place speed (the same Xeon)."""
        rows, cols = self.panels
        if not rows or m < PANEL_MIN_READS * rows or n < PANEL_MIN_READS * cols:
            return False
        unaligned = any(x % self.vector_width for x in (n, *b_offsets))
        aliased = (n * itemsize) % PANEL_ALIAS_BYTES == 0 and k >= PANEL_ALIAS_ROWS
        return unaligned or aliased

    @property
    def with_panels(self) -> OpenCLProgram:
        """The variant of this program that reads A and B from panels (``TG_PANELS``)."""
        return replace(self, defines=tuple(sorted((*self.defines, ("TG_PANELS", "1")))))

def make_program(
    rung: str, filename: str, params: Mapping[str, int], dtype: np.dtype, *,
    local: tuple[int, int], tile: tuple[int, int], dim0_is_row: bool = False,
    vector_width: int = 1, local_mem: int = 0, panels: tuple[int, int] = (0, 0),
    extra: Callable[[Mapping[str, int]], Mapping[str, int]] | None = None,
) -> OpenCLProgram:
    """An :class:`OpenCLProgram` whose defines are the rung's parameters plus the types."""
    defines = {k: str(v) for k, v in params.items()}
    if extra is not None:
        defines.update({k: str(v) for k, v in extra(params).items()})
    defines.update(type_defines(dtype, vector_width))
    return OpenCLProgram(
        rung=rung, filename=filename, defines=tuple(sorted(defines.items())),
        local=local, tile=tile, dim0_is_row=dim0_is_row, local_mem=local_mem,
        panels=panels, vector_width=vector_width,
    )
