"""The machine code (SASS) of a CUDA rung, counted: what one thread issues per k step.

Every instruction takes one issue slot, and an SM sub-partition issues one warp instruction
per clock, as many as its FP32 units retire FFMAs. So the share of FFMAs among the
instructions a thread issues in the steady state caps the fraction of the FP32 peak a GEMM
kernel can reach, however well it hides latency. This module compiles a rung the way
``tilegemm kernels --resources`` does (numba-cuda → PTX → nvJitLink cubin, no GPU needed),
disassembles the cubin with ``nvdisasm`` (PyPI wheel ``nvidia-cuda-nvdisasm``), finds the
loops from the backward branches, and counts instruction classes:

- in the **hot loop**: the innermost loop holding the most FFMAs (the ``kk`` loop, or the
  whole k-tile loop once ``kk`` is fully unrolled);
- in **one k-tile**: the loop around it, along the interior path through its branches
  (full 128-bit loads, no scalar fallbacks or zero fills, fewest instructions; see
  ``Path.key``), with the hot loop counted as often as one k-tile runs it;
- in **one k-tile of an edge block**: the same loop along the longest path that still
  loads 128 bits, the bounds checks a block at the operands' edges makes around loads
  an interior block makes unchecked.

Both are reported per k step: divided by the k steps they hold (FFMAs / (BM·BN/threads)).
See docs/explain.md for the method and its limits.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from tilegemm.backends import get_backend
from tilegemm.errors import InvalidValueError, UnavailableError
from tilegemm.registry import KernelSpec

#: Instruction classes, in the order reports show them.
CLASSES = ("fma", "fp", "lds", "ldg", "sts", "stg", "bar", "int", "move", "branch", "local",
           "other")
CLASS_TITLES = {
    "fma": "FFMA/DFMA", "fp": "other FP", "lds": "LDS", "ldg": "LDG", "sts": "STS",
    "stg": "STG", "bar": "BAR", "int": "integer/address", "move": "moves/constants",
    "branch": "branches/control", "local": "local memory", "other": "other",
}

_INT_OPS = {"IMAD", "IADD3", "IADD", "LEA", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP",
            "ISCADD", "SEL", "IABS", "IMNMX", "VIMNMX", "IMUL", "POPC", "FLO", "BREV",
            "PRMT", "LEA.HI", "I2F", "F2I", "I2I", "PLOP3", "P2R", "R2P", "SGXT", "BMSK",
            "IDP"}
_MOVE_OPS = {"MOV", "S2R", "CS2R", "LDC", "S2UR", "R2UR", "SHFL", "CS2UR"}
_BRANCH_OPS = {"BRA", "BRX", "EXIT", "BSSY", "BSYNC", "WARPSYNC", "BMOV", "CALL", "RET",
               "JMP", "BREAK", "YIELD", "NANOSLEEP", "VOTE", "VOTEU", "ELECT"}
_FP_OPS = {"FMUL", "FADD", "DMUL", "DADD", "FSETP", "DSETP", "FSEL", "FMNMX", "MUFU",
           "F2F", "FCHK", "HFMA2", "HADD2", "HMUL2"}

_LINE = re.compile(
    r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:(@!?U?P[T0-9]+)\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)"
    r"\s*(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


@dataclass(frozen=True)
class Instr:
    addr: int
    pred: str
    op: str  # base opcode, e.g. LDS
    mods: str  # modifiers, e.g. .U.128
    operands: str
    target: int | None  # branch target address

    @property
    def text(self) -> str:
        pred = f"{self.pred} " if self.pred else ""
        return f"{pred}{self.op}{self.mods} {self.operands}".rstrip()

    @property
    def width(self) -> int:
        """Bytes a memory instruction moves per thread (128-bit → 16)."""
        for bits in ("128", "64", "32", "16", "8"):
            if f".{bits}" in self.mods or f".U{bits}" in self.mods or f".S{bits}" in self.mods:
                return int(bits) // 8
        return 4

    @property
    def cls(self) -> str:
        return classify(self.op, self.mods, self.operands)


def classify(op: str, mods: str = "", operands: str = "") -> str:
    """The class of one instruction (see ``CLASSES``)."""
    base = op[1:] if op.startswith("U") and op not in ("UMOV",) else op
    if op in ("FFMA", "DFMA"):
        return "fma"
    if op in ("LDL", "STL"):
        return "local"
    if op in ("LDS", "LDSM"):
        return "lds"
    if op in ("LDG", "LD", "LDGSTS"):
        return "ldg"
    if op == "STS":
        return "sts"
    if op in ("STG", "ST", "RED", "ATOM", "ATOMG"):
        return "stg"
    if op in ("BAR", "DEPBAR", "MEMBAR", "LDGDEPBAR"):
        return "bar"
    if op == "IMAD" and mods.startswith(".MOV"):
        return "move"
    if op in _MOVE_OPS or op in ("UMOV", "ULDC", "MOV32I") or base in _MOVE_OPS:
        return "move"
    if op in _BRANCH_OPS or base in _BRANCH_OPS:
        return "branch"
    if op in _FP_OPS:
        return "fp"
    if op in _INT_OPS or base in _INT_OPS:
        return "int"
    return "other"


def parse_sass(text: str) -> list[Instr]:
    """Instructions of the (single) kernel in nvdisasm's output, branch targets resolved."""
    raw: list[tuple[int, str, str, str, str, str | None]] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    for line in text.splitlines():
        lab = _LABEL.match(line.strip())
        if lab:
            pending.append(lab.group(1))
            continue
        m = _LINE.match(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for name in pending:
            labels[name] = addr
        pending = []
        t = _TARGET.search(m.group(5))
        raw.append((addr, m.group(2) or "", m.group(3), m.group(4), m.group(5),
                    t.group(1) if t else None))
    end = raw[-1][0] + 16 if raw else 0
    for name in pending:
        labels[name] = end
    return [Instr(a, p, o, md, ops, labels.get(t) if t else None)
            for a, p, o, md, ops, t in raw]


@dataclass
class Loop:
    start: int  # address of the header (first instruction)
    end: int  # address of the last backward branch to the header
    children: list[Loop] = field(default_factory=list)

    def contains(self, addr: int) -> bool:
        return self.start <= addr <= self.end


def find_loops(instrs: list[Instr]) -> list[Loop]:
    """Loops from backward branches: the range [target, branch] of each, nested by range."""
    ends: dict[int, int] = {}
    for ins in instrs:
        if ins.op in ("BRA", "JMP") and ins.target is not None and ins.target <= ins.addr:
            ends[ins.target] = max(ends.get(ins.target, -1), ins.addr)
    loops = sorted((Loop(s, e) for s, e in ends.items()), key=lambda lp: (lp.start, -lp.end))
    roots: list[Loop] = []
    stack: list[Loop] = []
    for lp in loops:
        while stack and not (stack[-1].start <= lp.start and lp.end <= stack[-1].end):
            stack.pop()
        (stack[-1].children if stack else roots).append(lp)
        stack.append(lp)
    return roots


def _all_loops(roots: list[Loop]) -> list[Loop]:
    out: list[Loop] = []
    for lp in roots:
        out.append(lp)
        out.extend(_all_loops(lp.children))
    return out


@dataclass(frozen=True)
class Path:
    """Instruction counts along one path (a Counter of classes plus memory bytes)."""
    counts: tuple[tuple[str, int], ...]
    ldg_bytes: int
    lds_bytes: int
    lds_widths: tuple[tuple[int, int], ...]
    ldg_widths: tuple[tuple[int, int], ...]
    sts_bytes: int = 0  # shared bytes stored, zero fills (stores of RZ) not counted
    scalar_ldg: int = 0  # global loads narrower than 128 bits (edge and fallback paths)

    @staticmethod
    def of(instrs: list[Instr]) -> Path:
        c = Counter(i.cls for i in instrs)
        lds = Counter(i.width for i in instrs if i.cls == "lds")
        ldg = Counter(i.width for i in instrs if i.cls == "ldg")
        return Path(tuple(sorted(c.items())), sum(w * n for w, n in ldg.items()),
                    sum(w * n for w, n in lds.items()), tuple(sorted(lds.items())),
                    tuple(sorted(ldg.items())),
                    sum(i.width for i in instrs
                        if i.cls == "sts" and not i.operands.rstrip().endswith("RZ")),
                    sum(n for w, n in ldg.items() if w < 16))

    @staticmethod
    def empty() -> Path:
        return Path((), 0, 0, (), ())

    def __add__(self, other: Path) -> Path:
        return Path(_merge(self.counts, other.counts), self.ldg_bytes + other.ldg_bytes,
                    self.lds_bytes + other.lds_bytes, _merge(self.lds_widths, other.lds_widths),
                    _merge(self.ldg_widths, other.ldg_widths), self.sts_bytes + other.sts_bytes,
                    self.scalar_ldg + other.scalar_ldg)

    def __mul__(self, k: int) -> Path:
        return Path(tuple((a, n * k) for a, n in self.counts), self.ldg_bytes * k,
                    self.lds_bytes * k, tuple((a, n * k) for a, n in self.lds_widths),
                    tuple((a, n * k) for a, n in self.ldg_widths), self.sts_bytes * k,
                    self.scalar_ldg * k)

    def get(self, cls: str) -> int:
        return dict(self.counts).get(cls, 0)

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)

    def key(self, vector: bool = True, edge: bool = False) -> tuple[int, ...]:
        """Preference between paths, for the interior path of a GEMM k-tile: most FMAs;
        in a loop with 128-bit global loads the most bytes in those and the fewest narrower
        ones (the fallback paths), else the most global bytes; most shared bytes stored
        (zero fills not counted); most barriers; then fewest instructions. ``edge``: the
        same but the most instructions last, the path of a block at the operands' edges
        whose loads still go whole (checked loads, where an interior block's go
        unchecked)."""
        wide = sum(w * n for w, n in self.ldg_widths if w >= 16)
        loads = (wide, -self.scalar_ldg) if vector else (self.ldg_bytes, 0)
        return (self.get("fma"), *loads, self.sts_bytes, self.get("bar"),
                self.total if edge else -self.total)


def _merge(a: tuple, b: tuple) -> tuple:
    c: Counter = Counter(dict(a))
    c.update(dict(b))
    return tuple(sorted(c.items()))


def _blocks(instrs: list[Instr], lo: int, hi: int) -> list[list[Instr]]:
    """Basic blocks of the instructions in [lo, hi]."""
    body = [i for i in instrs if lo <= i.addr <= hi]
    targets = {i.target for i in instrs if i.target is not None}
    blocks: list[list[Instr]] = []
    for ins in body:
        if not blocks or ins.addr in targets or _ends_block(blocks[-1][-1]):
            blocks.append([])
        blocks[-1].append(ins)
    return blocks


def _ends_block(ins: Instr) -> bool:
    return ins.op in ("BRA", "BRX", "JMP", "EXIT", "RET", "CALL")


def _unconditional(ins: Instr) -> bool:
    return ins.op in ("BRA", "JMP", "EXIT", "RET", "BRX") and ins.pred in ("", "@PT")


def best_path(instrs: list[Instr], loop: Loop, trips: dict[int, int],
              edge: bool = False) -> Path:
    """Counts along the preferred path through one iteration of ``loop`` (``Path.key``;
    ``edge``: the edge block's).

    Inner loops are collapsed into one node each, counted ``trips[start]`` times (once when
    unknown); the path runs from the header to a backward branch to it.
    """
    nodes: list[tuple[int, int, Path, list[Instr]]] = []  # (start, end, weight, exits)
    covered: set[int] = set()
    for child in loop.children:
        weight = best_path(instrs, child, trips, edge) * trips.get(child.start, 1)
        exits = [i for i in instrs if child.contains(i.addr)]
        nodes.append((child.start, child.end, weight, exits))
        covered.update(i.addr for i in exits)
    for blk in _blocks(instrs, loop.start, loop.end):
        rest = [i for i in blk if i.addr not in covered]
        if rest:
            nodes.append((rest[0].addr, rest[-1].addr, Path.of(rest), rest))
    nodes.sort(key=lambda n: n[0])
    starts = {n[0]: idx for idx, n in enumerate(nodes)}

    def node_at(addr: int) -> int | None:
        for idx, (s, e, _, _) in enumerate(nodes):
            if s <= addr <= e:
                return idx
        return None

    vector = any(i.cls == "ldg" and i.width >= 16 for i in instrs if loop.contains(i.addr))
    best: list[Path | None] = [None] * len(nodes)
    best[0] = nodes[0][2]
    result: Path | None = None
    for idx, (s, e, _, body) in enumerate(nodes):
        cur = best[idx]
        if cur is None:
            continue
        succ: set[int] = set()
        last = body[-1]
        for ins in body:
            # only jumps are edges: BSSY's label is where a divergent region reconverges
            # and CALL's a function, neither a place this instruction goes to next
            if ins.target is None or ins.op not in ("BRA", "JMP"):
                continue
            if ins.target == loop.start and ins.addr >= s:
                if result is None or cur.key(vector, edge) > result.key(vector, edge):
                    result = cur
            elif loop.start < ins.target <= loop.end and ins.target > e:
                t = starts.get(ins.target, node_at(ins.target))
                if t is not None:
                    succ.add(t)
        if not _unconditional(last) and idx + 1 < len(nodes):
            succ.add(idx + 1)
        for t in succ:
            cand = cur + nodes[t][2]
            if best[t] is None or cand.key(vector, edge) > best[t].key(vector, edge):
                best[t] = cand
    return result if result is not None else Path.of(
        [i for i in instrs if loop.contains(i.addr)])


@dataclass
class SassReport:
    kernel: str
    source: str  # "numba" or "CUDA C"
    arch: str
    dtype: str
    params: dict[str, int]
    fma_per_kstep: int
    bk: int
    instructions: int
    hot: Path
    hot_ksteps: float
    tile: Path
    tile_ksteps: float
    edge: Path  # one k-tile of a block at the operands' edges (see Path.key)
    hot_range: tuple[int, int]
    hot_lines: list[str]  # the hot loop's SASS, each line with its class
    local_memory: int  # LDL/STL anywhere in the kernel

    def per_kstep(self, path: Path, ksteps: float) -> dict[str, float]:
        d = {c: path.get(c) / ksteps for c in CLASSES}
        d["total"] = path.total / ksteps
        return d

    @staticmethod
    def share(path: Path) -> float:
        return path.get("fma") / path.total if path.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        def region(path: Path, ksteps: float) -> dict[str, Any]:
            return {
                "ksteps": ksteps,
                "per_kstep": self.per_kstep(path, ksteps),
                "lds_by_width": {f"{w * 8}-bit": n / ksteps for w, n in path.lds_widths},
                "ldg_by_width": {f"{w * 8}-bit": n / ksteps for w, n in path.ldg_widths},
                "fma_share": self.share(path),
                "fma_per_shared_byte": (path.get("fma") / path.lds_bytes
                                        if path.lds_bytes else None),
                "issue_bound_fraction_of_peak": self.share(path),
            }
        return {
            "kernel": self.kernel, "source": self.source, "arch": self.arch,
            "dtype": self.dtype, "params": self.params,
            "fma_per_kstep": self.fma_per_kstep, "BK": self.bk,
            "instructions": self.instructions, "local_memory_instructions": self.local_memory,
            "hot_loop": {"start": f"{self.hot_range[0]:#06x}", "end": f"{self.hot_range[1]:#06x}",
                         **region(self.hot, self.hot_ksteps)},
            "k_tile": region(self.tile, self.tile_ksteps),
            "k_tile_edge": region(self.edge, self.tile_ksteps),
        }


def hot_loop(instrs: list[Instr], counted: Callable[[Instr], bool], kernel: str,
             what: str) -> tuple[Loop, list[Loop]]:
    """The hot loop of a kernel and every loop holding ``counted`` instructions (the
    arithmetic: FFMA, HMMA). The hot loop is the innermost such loop with the most of them;
    of equals, the shortest."""
    loops = _all_loops(find_loops(instrs))
    if not loops:
        raise RuntimeError(f"{kernel}: no loop found in the machine code")

    def count(lp: Loop) -> int:
        return sum(1 for i in instrs if lp.contains(i.addr) and counted(i))

    holding = [lp for lp in loops if count(lp)]
    if not holding:
        raise RuntimeError(f"{kernel}: no loop with {what} found in the machine code")
    innermost = [lp for lp in holding if not any(count(c) for c in lp.children)]
    return max(innermost, key=lambda lp: (count(lp), -(lp.end - lp.start))), holding


def listing(instrs: list[Instr], loop: Loop, title: Callable[[Instr], str]) -> list[str]:
    """The loop's SASS, a line per instruction, each with its address and ``title``."""
    return [f"/*{i.addr:04x}*/ {i.text:<64} // {title(i)}"
            for i in instrs if loop.contains(i.addr)]


def analyse(text: str, *, kernel: str, source: str, arch: str, dtype: str,
            params: dict[str, int], fma_per_kstep: int, bk: int) -> SassReport:
    """Count the hot loop and one interior k-tile of a disassembled GEMM kernel."""
    instrs = parse_sass(text)
    hot, with_fma = hot_loop(instrs, lambda i: i.cls == "fma", kernel, "FFMA/DFMA")
    hot_path = best_path(instrs, hot, {})
    tile_fma = fma_per_kstep * bk
    hot_fma = hot_path.get("fma")
    tile_loop = hot
    if hot_fma < tile_fma:
        parents = [lp for lp in with_fma if lp is not hot and lp.start <= hot.start
                   and hot.end <= lp.end]
        if parents:
            tile_loop = min(parents, key=lambda lp: lp.end - lp.start)
    # Every loop inside the k-tile that is a copy of the hot loop runs as often: rung 9
    # in float64 has two k-step loops per trip, one per shared buffer.
    trips = {} if tile_loop is hot else {
        lp.start: max(1, tile_fma // hot_fma) for lp in with_fma
        if lp is not tile_loop and tile_loop.start <= lp.start and lp.end <= tile_loop.end
        and (lp is hot or best_path(instrs, lp, {}).get("fma") == hot_fma)}
    tile_path = best_path(instrs, tile_loop, trips)
    edge_path = best_path(instrs, tile_loop, trips, edge=True)
    lines = listing(instrs, hot, lambda i: CLASS_TITLES[i.cls])
    return SassReport(
        kernel=kernel, source=source, arch=arch, dtype=dtype, params=params,
        fma_per_kstep=fma_per_kstep, bk=bk, instructions=len(instrs), hot=hot_path,
        hot_ksteps=hot_fma / fma_per_kstep, tile=tile_path,
        tile_ksteps=tile_path.get("fma") / fma_per_kstep, edge=edge_path,
        hot_range=(hot.start, hot.end),
        hot_lines=lines, local_memory=sum(1 for i in instrs if i.cls == "local"))


# ---------------------------------------------------------------- toolchain


def nvdisasm_path() -> str:
    """The nvdisasm executable: the PyPI wheel's, else one on PATH."""
    try:
        import nvidia  # namespace package of the NVIDIA wheels
        for root in nvidia.__path__:
            for pattern in ("*/bin/nvdisasm", "cuda_nvdisasm/bin/nvdisasm"):
                for hit in sorted(glob.glob(os.path.join(root, pattern))):
                    if os.access(hit, os.X_OK):
                        return hit
    except ImportError:
        pass
    found = shutil.which("nvdisasm")
    if found:
        return found
    raise UnavailableError("nvdisasm is missing: pip install nvidia-cuda-nvdisasm "
                       "(or put the CUDA toolkit's nvdisasm on PATH)")


@cache
def nvdisasm_version() -> str:
    out = subprocess.run([nvdisasm_path(), "--version"], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


def disassemble(cubin: bytes) -> str:
    """nvdisasm's text for a cubin (``-c``: code sections only)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        res = subprocess.run([nvdisasm_path(), "-c", path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if res.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {res.stderr.strip()}")
    return res.stdout


def link_cubin(ptx: str, arch: str) -> bytes:
    """Link PTX to a cubin for ``arch`` with nvJitLink (as ``kernels --resources`` does)."""
    from tilegemm.analysis.resources import link

    return link(ptx, arch)[1]


def nvvm_version() -> str:
    """The NVVM (CUDA C++/numba IR compiler) version that made the PTX."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("nvidia-nvvm", "nvidia-cuda-nvcc"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    from numba.cuda.cudadrv import nvvm

    return ".".join(map(str, nvvm.NVVM().get_version()))


def toolchain() -> dict[str, str]:
    return {"nvdisasm": nvdisasm_version(), "nvvm": nvvm_version()}


def fma_per_kstep(spec: KernelSpec, params: dict[str, int]) -> int:
    """FFMAs one thread issues per k step: its share of the BM×BN block tile."""
    threads = spec.threads(params) if spec.threads else None
    if not threads or "BM" not in params or "BN" not in params:
        from tilegemm import registry

        counted = [s.name for s in registry.specs_for(spec.backend)
                   if "BM" in s.defaults() and "BN" in s.defaults() and s.threads]
        raise InvalidValueError(
            f"--sass counts the machine code per k step of rungs with a BM×BN block tile; "
            f"{spec.name} has none. On {spec.backend}: {', '.join(counted) or 'none'}")
    return params["BM"] * params["BN"] // threads


def sass_report(spec: KernelSpec, params: dict[str, int] | None = None,
                dtype: str = "float32", arch: str = "sm_90") -> SassReport:
    """Compile, disassemble and count one CUDA rung (numba or CUDA C)."""
    from tilegemm.analysis.resources import ARCHS

    if arch not in ARCHS:
        raise InvalidValueError(f"unknown arch {arch!r}; choices: {', '.join(ARCHS)}")
    backend = get_backend(spec.backend)
    if arch not in backend.compile_archs:
        raise InvalidValueError(f"{spec.name} is a {spec.backend} kernel; --sass needs a CUDA rung "
                         "(tilegemm kernels --backend cuda)")
    params = spec.resolve(params)
    nvdisasm_path()  # fail early, with the one-line message, when it is missing
    dt = np.dtype(dtype).name
    per_kstep = fma_per_kstep(spec, params)
    text = _disassembled(spec, tuple(sorted(params.items())), dt, arch)
    return analyse(text, kernel=spec.name,
                   source=backend.kernel_source, arch=arch,
                   dtype=dt, params=params, fma_per_kstep=per_kstep, bk=params["BK"])


@cache
def _disassembled(spec: KernelSpec, params: tuple[tuple[str, int], ...], dtype: str,
                  arch: str) -> str:
    return disassemble(cubin_for(spec, dict(params), dtype, arch))


def cubin_for(spec: KernelSpec, params: dict[str, int], dtype: str, arch: str) -> bytes:
    """The cubin of a rung: numba rungs through PTX and nvJitLink; CUDA C ones via NVRTC."""
    return get_backend(spec.backend).cubin(spec, params, dtype, arch)
