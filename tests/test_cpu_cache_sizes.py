"""The CPU backend's L2 size (sysfs on Linux), which decides how the blocked rung splits
products of a few row blocks (``k02_blocked.one_row_block``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegemm
from conftest import host_blocked_params
from tilegemm.backends import cpu
from tilegemm.kernels.cpu import k02_blocked


def _cache(root: Path, index: int, level: str, kind: str, size: str, shared: str) -> None:
    d = root / f"index{index}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size),
                        ("shared_cpu_list", shared)):
        (d / name).write_text(value + "\n")


@pytest.mark.parametrize(("l2", "shared", "expected"), [
    ("2048K", "0", 2 * 1024**2),            # a Xeon core (no hyperthreads)
    ("1024K", "0,64", 512 * 1024),          # a Zen 4 core and its hyperthread
    ("2M", "0-3", 512 * 1024),              # a cluster of 4 small cores sharing 2 MiB
    ("512K", "0-1,8-9", 128 * 1024),
])
def test_l2_size_is_one_cpus_share_of_the_level_2_cache(tmp_path, l2, shared, expected):
    _cache(tmp_path, 0, "1", "Data", "48K", "0")
    _cache(tmp_path, 1, "1", "Instruction", "32K", "0")
    _cache(tmp_path, 2, "2", "Unified", l2, shared)
    _cache(tmp_path, 3, "3", "Unified", "32768K", "0-15")
    assert cpu._sysfs_l2(tmp_path) == expected


def test_l2_size_unknown_without_a_level_2_cache_or_with_an_unreadable_size(tmp_path):
    _cache(tmp_path, 0, "1", "Data", "48K", "0")
    _cache(tmp_path, 1, "3", "Unified", "32768K", "0-15")
    assert cpu._sysfs_l2(tmp_path) is None
    _cache(tmp_path, 2, "2", "Unified", "lots", "0")
    assert cpu._sysfs_l2(tmp_path) is None


def test_l2_size_of_this_machine_is_plausible():
    size = cpu.l2_cache_bytes()
    assert size is None or 64 * 1024 <= size <= 64 * 1024**2


@pytest.mark.parametrize(("l2", "budget"), [(None, 0), (1024**2, 640 * 1024),
                                            (2 * 1024**2, 1280 * 1024)])
def test_budget_for_one_row_block_follows_the_l2_size(monkeypatch, l2, budget):
    """No L2 size: no product of more than MC rows is one row block. With 1 MiB of L2 (AMD
    Zen 4/5), products of K >= KC are split as before this rule (the block of A of MC + MR
    rows and a chunk of B do not fit 5/8 of it); with 2 MiB (Intel Xeon), 128-256 rows of
    float32 at K >= 2048 are one block."""
    monkeypatch.setattr(cpu, "l2_cache_bytes", lambda: l2)
    assert k02_blocked.l2_budget() == budget
    zen = {"MR": 16, "NR": 8, "MC": 96, "KC": 512, "NC": 2048}
    xeon = {"MR": 8, "NR": 32, "MC": 96, "KC": 512, "NC": 2048}
    for m in (97, 112, 128, 192, 256):
        assert not k02_blocked.one_row_block(m, 4096, 4096, 2, zen, 4, 640 * 1024)
    for m in (97, 128, 192, 256):
        assert k02_blocked.one_row_block(m, 4096, 4096, 2, xeon, 4) == (l2 == 2 * 1024**2)
    # a panel of B that fits the budget (K = 32) is shared by several row blocks
    assert not k02_blocked.one_row_block(2048, 2048, 32, 2, xeon, 4)


@pytest.mark.parametrize(("l2", "chunk"), [(None, 512 * 1024), (512 * 1024, 256 * 1024),
                                           (1024**2, 512 * 1024), (2 * 1024**2, 512 * 1024)])
def test_chunk_of_b_is_at_most_half_of_l2(monkeypatch, l2, chunk):
    """A task of one row block packs B 512 KiB at a time, or half of L2 where that is less
    (AMD Zen 3: 512 KiB of L2), so the chunk stays in L2 beside the block of A."""
    monkeypatch.setattr(cpu, "l2_cache_bytes", lambda: l2)
    assert k02_blocked.b_chunk_bytes() == chunk
    # one_row_block budgets the same chunk: 1 MiB of budget holds 1 MiB - chunk of A
    params = {"MR": 8, "NR": 32, "MC": 96, "KC": 512, "NC": 2048}
    rows = (1024**2 - chunk) // (512 * 4) // 8 * 8  # float32 rows of A at KC = 512
    assert k02_blocked.one_row_block(rows, 4096, 4096, 2, params, 4, 1024**2)
    assert not k02_blocked.one_row_block(rows + 8, 4096, 4096, 2, params, 4, 1024**2)


def test_results_files_record_the_l2_size(monkeypatch):
    """Benchmarks record the CPU backend's details: the L2 size beside the family/model."""
    from tilegemm.backends import get_backend
    from tilegemm.bench.environment import backend_info

    monkeypatch.setattr(cpu, "l2_cache_bytes", lambda: 3 * 1024**2)
    monkeypatch.setattr(cpu, "cpu_family_model", lambda: "6-207")
    info = backend_info(get_backend("cpu"))
    assert info["l2_bytes_per_cpu"] == 3 * 1024**2 and info["cpu_family_model"] == "6-207"
    assert "device_info_error" not in info


def test_more_rows_are_one_row_block_only_with_256_columns_per_task():
    """Every task of one row block packs the whole block of A: a product of more than MC
    rows is one block only while each of two tasks per thread gets 256 columns of the
    panel (2048 columns: up to 4 threads), and the compiled module uses the same bound."""
    xeon = {"MR": 8, "NR": 32, "MC": 96, "KC": 512, "NC": 2048}
    budget = 2 * 1024**2
    for threads, fused in ((1, True), (2, True), (4, True), (5, False), (8, False)):
        assert k02_blocked.one_row_block(128, 4096, 4096, threads, xeon, 4, budget) == fused
    assert not k02_blocked.one_row_block(128, 900, 4096, 2, xeon, 4, budget)
    assert k02_blocked.one_row_block(96, 4096, 4096, 8, xeon, 4, budget)  # MC rows: as before
    spec = next(s for s in tilegemm.kernels("cpu") if s.name == "blocked")
    program = spec.program(host_blocked_params("float64"), np.dtype("float64"))
    assert program.__globals__["ONE_BLOCK_TASK_COLUMNS"] == k02_blocked.ONE_BLOCK_TASK_COLUMNS


@pytest.mark.parametrize(("values", "expected"), [
    # Apple M1: 12 MiB of L2 shared by the 4 performance cores
    ({"hw.perflevel0.l2cachesize": 12 * 1024**2, "hw.perflevel0.cpusperl2": 4}, 3 * 1024**2),
    ({"hw.l2cachesize": 256 * 1024}, 256 * 1024),  # an Intel Mac: per core, nothing shared
    ({}, None),
])
def test_l2_size_on_macos_from_sysctl(monkeypatch, values, expected):
    monkeypatch.setattr(cpu, "SYSFS_CACHES", Path("/nonexistent/cpu0/cache"))
    monkeypatch.setattr(cpu.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(cpu, "_sysctl_int", values.get)
    cpu.l2_cache_bytes.cache_clear()
    try:
        assert cpu.l2_cache_bytes() == expected
    finally:
        cpu.l2_cache_bytes.cache_clear()


@pytest.mark.parametrize(("l2", "shown"), [(2 * 1024**2, ", L2 2 MiB per CPU"),
                                           (512 * 1024, ", L2 512 KiB per CPU"), (None, "")])
def test_cpu_status_line_names_the_l2_size(monkeypatch, l2, shown):
    """``tilegemm info`` shows the L2 size the blocked rung sizes its work to."""
    monkeypatch.setattr(cpu, "l2_cache_bytes", lambda: l2)
    cpu._status.cache_clear()
    try:
        assert cpu._status().reason.endswith(f"CPU core(s){shown}")
    finally:
        cpu._status.cache_clear()


def test_usable_cpus_follow_the_affinity_set(monkeypatch):
    """Results files and `tilegemm info` said the machine's CPU count while the process
    (a container's CPU set, taskset) could use fewer, and Numba started fewer threads."""
    import os

    from tilegemm.backends import cpu
    from tilegemm.bench.environment import host_info

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert cpu.usable_cpus() == 1 and host_info()["cores"] == 1
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows
    assert cpu.usable_cpus() == 64
