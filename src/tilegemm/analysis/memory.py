"""From recorded per-thread memory accesses to the counts the hardware cares about.

The tracer (:mod:`tilegemm.analysis.trace`) records, for every array element a kernel
thread reads or writes, *which* instruction did it (a source site plus how many times this
thread had executed that site before: its dynamic instance), *where* (a byte address in a
virtual address space) and *how wide* (the element size). This module, pure NumPy and no
simulator, turns those records into warp-level figures:

- A **request** is one instruction executed by one warp: the accesses of the threads of a
  warp (32 consecutive linear thread ids, x fastest) at the same site and the same dynamic
  instance. This is how SIMT hardware issues memory instructions.
- **Global memory**: a request moves whole 32-byte **sectors**; the count of distinct
  32-byte segments a request touches is what the optimisation note calls "transactions" (and what
  Nsight Compute reports as ``l1tex__t_sectors_pipe_lsu_mem_global_op_{ld,st}.sum``).
- **Shared memory**: 32 banks of 4 bytes; bank = (address / 4) mod 32. Threads reading the
  *same* 4-byte word get it by broadcast; distinct words in one bank are serialised. A
  request costs as many **wavefronts** as the largest number of distinct words any bank
  has to deliver. Accesses wider than 4 bytes are split into phases that each move at most
  128 bytes (8-byte: half-warps, lanes 0-15 and 16-31; 16-byte: quarter-warps), the rule
  NVIDIA's programming guide gives for 64- and 128-bit accesses; a phase is conflict-free
  when it needs one wavefront. ``ideal`` wavefronts are the phases that have any access,
  so ``wavefronts - ideal`` is the cost of bank conflicts alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

WARP = 32
SECTOR = 32  # bytes: the unit global memory moves
BANKS = 32
BANK_BYTES = 4

GLOBAL, SHARED = 0, 1

# One record per thread access: the columns of the structured array the tracer hands over.
RECORD = np.dtype([
    ("thread", np.int32),    # linear thread id within the block (x fastest)
    ("site", np.int32),      # instruction site id (see SiteInfo)
    ("instance", np.int64),  # how many times this thread executed the site before
    ("addr", np.int64),      # byte address in the tracer's virtual address space
    ("size", np.int16),      # bytes accessed
])


@dataclass(frozen=True)
class SiteInfo:
    """One memory instruction in the source: where it is and what it touches."""

    id: int
    space: int       # GLOBAL or SHARED
    store: bool
    array: str       # 'A', 'B', 'C' or the shared allocation's label
    where: str       # file:line:column
    text: str        # the subscript expression as written, e.g. "sA[ty, k]"

    @property
    def kind(self) -> str:
        space = "global" if self.space == GLOBAL else "shared"
        return f"{space} {'store' if self.store else 'load'}"


@dataclass
class SiteCounts:
    """Warp-level counts for one site (summed over the blocks traced)."""

    requests: float = 0
    accesses: float = 0      # thread-level accesses (active lanes summed over requests)
    bytes: float = 0         # bytes the threads asked for
    sectors: float = 0       # global: distinct 32-byte segments per request, summed
    wavefronts: float = 0    # shared: wavefronts per request, summed
    ideal_wavefronts: float = 0
    conflicted: float = 0    # shared: requests needing more wavefronts than ideal
    max_degree: int = 0      # shared: worst distinct-words-per-bank in any phase

    def add(self, other: SiteCounts, weight: float = 1.0) -> None:
        self.requests += weight * other.requests
        self.accesses += weight * other.accesses
        self.bytes += weight * other.bytes
        self.sectors += weight * other.sectors
        self.wavefronts += weight * other.wavefronts
        self.ideal_wavefronts += weight * other.ideal_wavefronts
        self.conflicted += weight * other.conflicted
        self.max_degree = max(self.max_degree, other.max_degree)

    def as_dict(self) -> dict[str, float]:
        return {k: tidy(v) for k, v in self.__dict__.items()}


def tidy(v: float) -> float | int:
    """Integers stay integers in JSON (exact counts); scaled estimates keep their fraction."""
    return int(round(v)) if abs(v - round(v)) < 1e-9 else float(v)


@dataclass
class Counts:
    """Per-site counts; totals are derived so a table row always adds up to the total."""

    sites: dict[int, SiteCounts] = field(default_factory=dict)
    blocks: float = 0          # blocks counted (weighted when sampled)
    barriers: float = 0        # syncthreads per block, summed over blocks
    warp_barriers: float = 0   # barriers × warps per block, summed over blocks

    def add(self, other: Counts, weight: float = 1.0) -> None:
        self.blocks += weight * other.blocks
        self.barriers += weight * other.barriers
        self.warp_barriers += weight * other.warp_barriers
        for sid, c in other.sites.items():
            self.sites.setdefault(sid, SiteCounts()).add(c, weight)

    def total(self, infos: Mapping[int, SiteInfo], space: int, store: bool | None) -> SiteCounts:
        out = SiteCounts()
        for sid, c in self.sites.items():
            info = infos[sid]
            if info.space == space and (store is None or info.store == store):
                out.add(c)
        return out


def count_block(records: np.ndarray, infos: Mapping[int, SiteInfo]) -> Counts:
    """Warp-level counts for the records of one thread block."""
    counts = Counts()
    if records.size == 0:
        return counts
    warp = records["thread"] // WARP
    # One request = (warp, site, instance); number them densely.
    req_key = np.stack([warp, records["site"], records["instance"]], axis=1)
    uniq, req = np.unique(req_key, axis=0, return_inverse=True)
    req = req.ravel()
    req_site = uniq[:, 1]
    n_req = len(uniq)
    space = np.zeros(max(infos) + 1, dtype=np.int8)
    for sid, info in infos.items():
        space[sid] = info.space

    accesses = np.bincount(req, minlength=n_req)
    nbytes = np.bincount(req, weights=records["size"].astype(np.float64), minlength=n_req)

    # Global: distinct 32-byte segments per request (accesses are naturally aligned and at
    # most 16 bytes wide, so each lies in exactly one segment).
    seg = records["addr"] // SECTOR
    pairs = np.unique(np.stack([req, seg], axis=1), axis=0)
    sectors = np.bincount(pairs[:, 0], minlength=n_req)

    wave, ideal, degree = _shared_wavefronts(records, req, n_req)

    is_shared = space[req_site] == SHARED
    for r_site in np.unique(req_site):
        sel = req_site == r_site
        sh = bool(is_shared[sel][0])
        c = SiteCounts(
            requests=int(sel.sum()),
            accesses=int(accesses[sel].sum()),
            bytes=int(nbytes[sel].sum()),
            sectors=0 if sh else int(sectors[sel].sum()),
            wavefronts=int(wave[sel].sum()) if sh else 0,
            ideal_wavefronts=int(ideal[sel].sum()) if sh else 0,
            conflicted=int((wave[sel] > ideal[sel]).sum()) if sh else 0,
            max_degree=int(degree[sel].max()) if sh else 0,
        )
        counts.sites[int(r_site)] = c
    return counts


def _shared_wavefronts(records: np.ndarray, req: np.ndarray,
                       n_req: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Wavefronts, ideal wavefronts and worst bank degree per request (bank rule above).

    Computed for every request; callers use it only for shared-memory sites.
    """
    size = records["size"].astype(np.int64)
    lane = records["thread"].astype(np.int64) % WARP
    # Lanes per phase: 32 for <= 4-byte accesses, 16 for 8-byte, 8 for 16-byte.
    lanes_per_phase = WARP // np.maximum(1, size // BANK_BYTES)
    phase = lane // lanes_per_phase
    # An access of s >= 4 bytes covers s/4 consecutive 4-byte words; expand them.
    words_per = np.maximum(1, size // BANK_BYTES)
    rep = np.repeat(np.arange(len(records)), words_per)
    offset = np.arange(len(rep)) - np.repeat(np.cumsum(words_per) - words_per, words_per)
    word = records["addr"][rep] // BANK_BYTES + offset
    r, ph = req[rep], phase[rep]
    bank = word % BANKS
    # distinct words per (request, phase, bank)
    uniq = np.unique(np.stack([r, ph, bank, word], axis=1), axis=0)
    rpb, per_bank = np.unique(uniq[:, :3], axis=0, return_counts=True)
    # worst bank per (request, phase) = wavefronts of that phase
    rp, inv = np.unique(rpb[:, :2], axis=0, return_inverse=True)
    inv = inv.ravel()
    phase_waves = np.zeros(len(rp), dtype=np.int64)
    np.maximum.at(phase_waves, inv, per_bank)
    wave = np.bincount(rp[:, 0], weights=phase_waves, minlength=n_req).astype(np.int64)
    ideal = np.bincount(rp[:, 0], minlength=n_req).astype(np.int64)
    degree = np.zeros(n_req, dtype=np.int64)
    np.maximum.at(degree, rp[:, 0], phase_waves)
    return wave, ideal, degree
