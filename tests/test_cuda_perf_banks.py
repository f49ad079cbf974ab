"""Shared-memory bank conflicts of rungs 6 and 7, from their index expressions.

Each function below returns, for the 32 threads of warp 0, the shared-memory element index
one instruction touches, written as the kernel computes it: the tile sizes are the rungs'
defaults, the swizzle of a k row is the generator's own ``_sk``, and the store's
expression is checked against the line the generator writes into the kernel
(``test_the_modelled_expressions_are_the_generators``); the kernels' own correctness tests
fail if the layout is inconsistent, these count the conflicts. ``wavefronts`` applies the
hardware rule: a request is split into phases (32 threads for 4-byte words, 8 threads for
16-byte vectors); within a phase, each bank serves one distinct 4-byte word per wavefront.
No GPU and no simulator needed: this is arithmetic.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from tilegemm import registry
from tilegemm.kernels.cuda import k08_warptile

# float32 defaults of both rungs (the test below checks that they agree)
_DEFAULTS = registry.get("smem_layout", "cuda").defaults()
BM, BN, BK, TM, TN = (_DEFAULTS[k] for k in ("BM", "BN", "BK", "TM", "TN"))
W = k08_warptile.width(4)  # float32 elements per 128-bit vector
NT = (BM // TM) * (BN // TN)
TCOLS = BN // TN
WARP = range(32)


def wavefronts(elements: list[int], width: int) -> int:
    """Wavefronts for one warp request: ``elements[t]`` is thread t's first float32 index,
    ``width`` the floats each thread moves (1 scalar, 4 for a 128-bit vector)."""
    phase = 32 // width  # threads served per phase
    total = 0
    for p0 in range(0, 32, phase):
        words: dict[int, set[int]] = defaultdict(set)
        for t in range(p0, p0 + phase):
            for w in range(width):
                word = elements[t] + w
                words[word % 32].add(word)
        total += max(len(ws) for ws in words.values())
    return total


def ideal(width: int) -> int:
    return width  # phases per request (a 4-wide vector needs 4 phases at best)


# --- rung 6: As[BM][BK] row-major, thread rows/columns contiguous ------------------------

def k06_store_a(q: int = 0) -> list[int]:
    # vstore(As, (ar0, ac0), ...): ar0 = tid // (BK/W), ac0 = (tid % (BK/W)) * W
    return [(t // (BK // W)) * BK + (t % (BK // W)) * W for t in WARP]


def k06_read_a(i: int = 0, kk: int = 0) -> list[int]:
    # ld(As, (xa + i, kk)), xa = tr0 = ty * TM (k08_warptile._compute_rows)
    return [((t // TCOLS) * TM + i) * BK + kk for t in WARP]


def k06_read_b(j: int = 0, kk: int = 0) -> list[int]:
    # vload(Bs, (kk, xb_j)), xb_j = tc0 + j = tx * TN + j
    return [kk * BN + (t % TCOLS) * TN + j for t in WARP]


# --- transposed A without a swizzle (siboehm's kernel 6 layout), for comparison ----------

def transposed_store_a(q: int) -> list[int]:
    # As[c + q][r]
    return [((t % (BK // W)) * W + q) * BM + t // (BK // W) for t in WARP]


# --- rung 7: As[BK][BM] transposed + XOR swizzle, panel-split thread tiles -----------------

RPW = max(W, 32 * W // BK)  # as the generator computes it (k08_warptile.build's RPW)
PM, PN = BM // (TM // W), BN // (TN // W)
STORE_SWIZZLE = "swz = r ^ (((c // W) * RPW) & (BM - 1))"  # what k07_store_a computes


def k07_store_a(q: int) -> list[int]:
    # st(As, (c + q, r ^ (((c // W) * RPW) & (BM - 1))))
    out = []
    for t in WARP:
        r, c = t // (BK // W), (t % (BK // W)) * W
        out.append((c + q) * BM + (r ^ (((c // W) * RPW) & (BM - 1))))
    return out


def k07_read_a(i: int, kk: int) -> list[int]:
    # vload(As, (kk, ((i // W) * PM + ty * W) ^ sk))
    sk = k08_warptile._sk(kk, W, RPW, BM)
    return [kk * BM + (((i // W) * PM + (t // TCOLS) * W) ^ sk) for t in WARP]


def k07_read_b(j: int, kk: int) -> list[int]:
    # vload(Bs, (kk, (j // W) * PN + tx * W))
    return [kk * BN + (j // W) * PN + (t % TCOLS) * W for t in WARP]


def test_the_modelled_expressions_are_the_generators() -> None:
    """The hand-written models above follow the kernels: both rungs' defaults are the
    sizes modelled, the store's swizzle is the line the generator writes, and the
    generator's RPW is the one modelled (its source computes it as written here)."""
    import inspect

    for rung in ("vectorized", "smem_layout"):
        got = registry.get(rung, "cuda").defaults()
        assert (got["BM"], got["BN"], got["BK"], got["TM"], got["TN"]) == (BM, BN, BK, TM, TN)
    assert k08_warptile.STORE_A_TRANSPOSED[0] == STORE_SWIZZLE
    assert "RPW = max(W, 32 * W // BK)" in inspect.getsource(k08_warptile)


def test_rung6_conflicts_are_what_rung7_removes() -> None:
    assert wavefronts(k06_store_a(), W) == ideal(W)  # row-major vector stores: clean
    assert wavefronts(k06_read_a(), 1) == 2  # two thread rows 8·16 words apart: 2-way
    assert wavefronts(k06_read_b(), W) == 2 * ideal(W)  # 32-byte stride: 2-way
    # storing A transposed without a swizzle would be 4-way:
    assert max(wavefronts(transposed_store_a(q), 1) for q in range(W)) == 4


@pytest.mark.parametrize("q", range(W))
def test_rung7_stores_conflict_free(q: int) -> None:
    assert wavefronts(k07_store_a(q), 1) == 1


@pytest.mark.parametrize("kk", range(BK))
def test_rung7_reads_conflict_free(kk: int) -> None:
    for i in range(0, TM, W):
        assert wavefronts(k07_read_a(i, kk), W) == ideal(W)
    for j in range(0, TN, W):
        assert wavefronts(k07_read_b(j, kk), W) == ideal(W)


def test_rung7_swizzle_is_a_permutation_of_vector_groups() -> None:
    """Every (k, m) has its own slot and aligned groups of W columns stay together."""
    for k in range(BK):
        s = ((k // W) * RPW) & (BM - 1)
        cols = [m ^ s for m in range(BM)]
        assert sorted(cols) == list(range(BM))
        assert all(cols[g] + w == cols[g + w] for g in range(0, BM, W) for w in range(W))
