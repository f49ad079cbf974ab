"""``tilegemm.plan``: what ``kernel="auto"`` chooses and why, and the parameter database's
lookup order (the user's tuning cache → this device → its ISA → the rung's defaults)."""

from __future__ import annotations

import numpy as np
import pytest

import tilegemm
from tilegemm import registry
from tilegemm.backends import get_backend
from tilegemm.backends.base import Limits, Target
from tilegemm.kernels.cpu import k02_blocked
from tilegemm.tune import cache as tcache
from tilegemm.tune import database, select


def _target(name: str) -> Target:
    return Target("cpu", name, "cpu", "x86_64", Limits(threads_per_block=0), "perf_counter")


TABLE = (
    {"backend": "cpu", "device": "Other CPU", "isa": "avx2", "dtype": "float32",
     "kernel": "blocked", "params": {"MR": 4}},
    {"backend": "cpu", "device": "*", "isa": "avx2", "dtype": "float32",
     "kernel": "blocked", "params": {"MR": 8}},
    {"backend": "cpu", "device": "Chip X", "isa": "avx2", "dtype": "float32",
     "kernel": "blocked", "params": {"MR": 6}},
    {"backend": "cpu", "device": "Chip X", "isa": "avx512", "dtype": "float32",
     "kernel": "blocked", "params": {"MR": 16}},
)


def test_database_lookup_order(monkeypatch):
    monkeypatch.setattr(database, "host_isa", lambda: "avx2")
    entry, tier = database.lookup(_target("Chip X"), "float32", TABLE)
    assert (entry["params"], tier) == ({"MR": 6}, "device")  # name and ISA both match
    entry, tier = database.lookup(_target("Chip Y"), "float32", TABLE)
    assert (entry["params"], tier) == ({"MR": 8}, "isa")  # the ISA's "*" entry first
    assert database.lookup(_target("Chip X"), "float64", TABLE) is None  # rung defaults
    monkeypatch.setattr(database, "host_isa", lambda: "avx512")
    entry, tier = database.lookup(_target("Chip X"), "float32", TABLE)
    assert (entry["params"], tier) == ({"MR": 16}, "device")  # same name, other ISA
    monkeypatch.setattr(database, "host_isa", lambda: "generic")
    assert database.lookup(_target("Chip X"), "float32", TABLE) is None


def test_database_entry_for_another_cpu_generation_does_not_apply(monkeypatch):
    """Zen 4 and Zen 5 both report "AMD EPYC": an entry naming a CPU family or model
    serves that CPU only (the closest match first), and other generations fall to the
    ISA's defaults."""
    table = (
        {"backend": "cpu", "device": "*", "isa": "avx512", "dtype": "float32",
         "kernel": "blocked", "params": {"MR": 8}},
        {"backend": "cpu", "device": "AMD EPYC", "cpu": "25", "isa": "avx512",
         "dtype": "float32", "kernel": "blocked", "params": {"MR": 16}},
        {"backend": "cpu", "device": "AMD EPYC", "cpu": "26-2", "isa": "avx512",
         "dtype": "float32", "kernel": "blocked", "params": {"MR": 12}},
        {"backend": "cpu", "device": "AMD EPYC", "isa": "avx512", "dtype": "float32",
         "kernel": "blocked", "params": {"MR": 6}},
    )
    monkeypatch.setattr(database, "host_isa", lambda: "avx512")
    found = {}
    for fm in ("25-17", "26-2", "26-17", "6-207"):
        monkeypatch.setattr(database, "host_family_model", lambda fm=fm: fm)
        entry, tier = database.lookup(_target("AMD EPYC"), "float32", table)
        found[fm] = (entry["params"]["MR"], tier)
    assert found == {"25-17": (16, "device"),  # the family's entry beats the plain one
                     "26-2": (12, "device"),  # the model's entry beats both
                     "26-17": (6, "device"),  # only the entry that names no CPU applies
                     "6-207": (6, "device")}
    monkeypatch.setattr(database, "host_family_model", lambda: "26-2")
    entry, tier = database.lookup(_target("AMD EPYC"), "float32", table[:2])
    assert (entry["params"]["MR"], tier) == (8, "isa")  # Zen 4's entry is not Zen 5's


def test_database_entry_with_a_min_shape_serves_products_that_large_only(monkeypatch):
    """A tile measured faster on large products (6x64 on a Xeon) loses where most of its
    columns are padding: an entry naming "min_shape" serves products at least that large
    in every dimension it names, before the device's entry without a bound; others, and a
    lookup without a shape, get the unbounded entry. The CPU model still ranks first."""
    table = (
        {"backend": "cpu", "device": "Chip X", "isa": "avx512", "dtype": "float32",
         "kernel": "blocked", "params": {"MR": 8}},
        {"backend": "cpu", "device": "Chip X", "isa": "avx512", "dtype": "float32",
         "kernel": "blocked", "params": {"MR": 6}, "min_shape": {"m": 64, "n": 512}},
        {"backend": "cpu", "device": "*", "isa": "avx512", "dtype": "float32",
         "kernel": "blocked", "params": {"MR": 4}},
        {"backend": "cpu", "device": "*", "isa": "avx512", "dtype": "float32",
         "kernel": "blocked", "params": {"MR": 12}, "min_shape": {"k": 100}},
    )
    monkeypatch.setattr(database, "host_isa", lambda: "avx512")
    monkeypatch.setattr(database, "host_family_model", lambda: "6-167")

    def mr(name: str, shape, tbl=table) -> tuple[int, str]:
        entry, tier = database.lookup(_target(name), "float32", tbl, shape=shape)
        return entry["params"]["MR"], tier

    assert mr("Chip X", (64, 512, 1)) == (6, "device")  # the bounds are inclusive
    assert mr("Chip X", (4096, 4096, 4096)) == (6, "device")
    assert mr("Chip X", (63, 4096, 4096)) == (8, "device")  # one dimension short
    assert mr("Chip X", (4096, 511, 4096)) == (8, "device")
    assert mr("Chip X", None) == (8, "device")  # shape unknown: the unbounded entry
    # the ISA's "*" entries, bounded before unbounded where the shape allows
    assert mr("Chip Y", (8, 8, 100)) == (12, "isa")
    assert mr("Chip Y", (8, 8, 99)) == (4, "isa")
    # a bounded entry alone serves no other shape: the rung's defaults then
    assert database.lookup(_target("Chip X"), "float32", table[1:2], shape=(8, 8, 8)) is None
    # an entry for this CPU model beats a bounded one that names no CPU
    modelled = ({**table[0], "cpu": "6-167", "params": {"MR": 16}},) + table
    assert mr("Chip X", (4096, 4096, 4096), modelled) == (16, "device")
    assert database.bound_text(table[1]) == "M >= 64, N >= 512"
    assert database.shape_class((64, 512, 8), table) == (True, False)
    assert database.shape_class((64, 511, 100), table) == (False, True)


def test_auto_takes_a_bounded_database_entry_per_product(monkeypatch):
    """``kernel="auto"`` remembers database answers per class of shapes, not per device
    alone: a large product, then a narrow one, then the large one again each get their
    entry, in plan() and in what runs, and plan() says which bound applied."""
    target = get_backend("cpu").target()
    base = {"backend": "cpu", "device": target.name, "isa": database.host_isa(),
            "dtype": "float32", "kernel": "blocked", "measured": "test"}
    table = ({**base, "params": {"MR": 8, "NR": 32}},
             {**base, "params": {"MR": 6, "NR": 64}, "min_shape": {"n": 512}})
    monkeypatch.setattr(database, "entries", lambda path=database.PATH: table)
    monkeypatch.setattr(select, "_db_memo", {})
    monkeypatch.setattr(select, "_memo", {})
    monkeypatch.setattr(database, "host_family_model", lambda: "0-0")
    # 512, 511 and 300 share the tuning cache's bucket (512): a named rung's answers were
    # remembered per bucket, so the first of them decided for the others
    for kernel in ("auto", "blocked"):
        for n, tile in [(512, (6, 64)), (511, (8, 32)), (300, (8, 32)), (700, (6, 64)),
                        (40, (8, 32)), (512, (6, 64))]:
            a, b = np.ones((200, 300), np.float32), np.ones((300, n), np.float32)
            planned = tilegemm.plan(a, b, kernel=kernel)
            assert (planned.params["MR"], planned.params["NR"]) == tile, (kernel, n)
            bounded = tile == (6, 64)
            assert planned.source == ("database (device; N >= 512)" if bounded
                                      else "database (device)"), planned.source
            seen = _ran(monkeypatch,
                        lambda a=a, b=b, k=kernel: tilegemm.matmul(a, b, kernel=k))
            assert (seen["params"]["MR"], seen["params"]["NR"]) == tile, (kernel, n)


def test_shipped_database_entries_are_valid_parameters():
    from tilegemm import registry

    for e in database.entries():
        spec = registry.get(e["kernel"], e["backend"])
        assert spec.supports(e["dtype"]) and spec.is_valid(spec.resolve(e["params"])), e
        # CPU entries and OpenCL CPU devices' name the vector ISA; an OpenCL GPU has none
        assert e["isa"] in ("avx2", "avx512", "neon", ""), e
        assert e["isa"] or e["backend"] == "opencl", e
        assert e.get("measured"), e
        # "cpu" names a family ("25") or a family and model ("26-2") of /proc/cpuinfo
        assert set(e.get("cpu", "0")) <= set("0123456789-"), e
        # "min_shape" bounds M, N or K from below (see database.serves)
        least = e.get("min_shape", {})
        assert set(least) <= set(database.SHAPE_DIMS), e
        assert all(isinstance(v, int) and v > 0 for v in least.values()), e


def test_opencl_cpu_device_entries_match_name_and_the_hosts_isa(monkeypatch):
    """An OpenCL CPU device (PoCL) compiles for the host CPU, so its entries are bound to
    the host's ISA: KVM names Xeons of every generation "Intel(R) Xeon(R) Processor", and an
    AVX2 one has half the vector registers of AVX-512. Another CPU device falls through to
    the ISA's entry, an AVX2 host's to the rung's own defaults, and so does an OpenCL GPU,
    which has no ISA to share entries with."""

    def opencl(name: str, kind: str = "cpu") -> Target:
        return Target("opencl", name, kind, "", Limits(threads_per_block=4096), "events")

    name = "pthread-Intel(R) Xeon(R) Processor"
    monkeypatch.setattr(database, "host_hardware_isa", lambda: "avx512")
    entry, tier = database.lookup(opencl(name), "float32")
    assert (entry["kernel"], entry["params"]["TM"], entry["params"]["TN"], tier) == (
        "vectorized", 8, 32, "device")
    assert database.lookup(opencl(name), "float64") is None
    # another CPU device on an AVX-512 host: the ISA's own entry, not this device's
    entry, tier = database.lookup(opencl("pthread-AMD EPYC 9R14"), "float32")
    assert (entry["device"], tier) == ("*", "isa")
    assert database.lookup(opencl(name, kind="gpu"), "float32") is None
    monkeypatch.setattr(database, "host_hardware_isa", lambda: "avx2")
    assert database.lookup(opencl(name), "float32") is None


def test_opencl_cpu_devices_share_an_isa_tier_entry(monkeypatch):
    """A "*" entry of an ISA serves every OpenCL CPU device on a host of that ISA without
    an entry of its own, and never an OpenCL GPU."""
    table = (
        {"backend": "opencl", "device": "*", "isa": "avx512", "dtype": "float32",
         "kernel": "vectorized", "params": {"TM": 8}},
        {"backend": "opencl", "device": "pthread-Chip X", "isa": "avx512", "dtype": "float32",
         "kernel": "vectorized", "params": {"TM": 16}},
    )

    def opencl(name: str, kind: str = "cpu") -> Target:
        return Target("opencl", name, kind, "", Limits(threads_per_block=4096), "events")

    monkeypatch.setattr(database, "host_hardware_isa", lambda: "avx512")
    assert database.lookup(opencl("pthread-Chip X"), "float32", table)[0]["params"]["TM"] == 16
    entry, tier = database.lookup(opencl("pthread-Chip Y"), "float32", table)
    assert (entry["params"]["TM"], tier) == (8, "isa")
    assert database.lookup(opencl("GPU Z", kind="gpu"), "float32", table) is None
    monkeypatch.setattr(database, "host_hardware_isa", lambda: "avx2")
    assert database.lookup(opencl("pthread-Chip Y"), "float32", table) is None


def test_an_opencl_gpus_entry_serves_that_gpu_only():
    """An OpenCL GPU has no ISA (""): its entry is its own, never the entry of an "isa"
    tier that every other GPU would fall into."""
    table = ({"backend": "opencl", "device": "GPU A", "isa": "", "dtype": "float32",
              "kernel": "vectorized", "params": {"TM": 4}},)

    def gpu(name: str) -> Target:
        return Target("opencl", name, "gpu", "", Limits(threads_per_block=1024), "events")

    entry, tier = database.lookup(gpu("GPU A"), "float32", table)
    assert (entry["params"]["TM"], tier) == (4, "device")
    assert database.lookup(gpu("GPU B"), "float32", table) is None


def test_an_entry_for_a_cpu_family_serves_that_family_only():
    """"cpu": "2" is family 2, not every family whose number starts with 2 (25, 26)."""
    assert database._cpu_rank({"cpu": "2"}, "25-17") is None
    assert database._cpu_rank({"cpu": "25"}, "25-17") == 1
    assert database._cpu_rank({"cpu": "25-17"}, "25-17") == 2
    assert database._cpu_rank({"cpu": "25-1"}, "25-17") is None
    assert database._cpu_rank({}, "25-17") == 0


def test_the_host_hardware_isa_ignores_what_numba_is_told(monkeypatch):
    """PoCL compiles for the CPU it runs on: NUMBA_CPU_FEATURES (code for another machine)
    changes the CPU rung's tier, not an OpenCL CPU device's."""
    from numba.core import config

    real = database.host_hardware_isa.__wrapped__()
    if database.compiled_arch() != "x86_64" or real == "generic":
        pytest.skip("needs an x86-64 CPU with AVX2 or AVX-512 to tell the two apart")
    monkeypatch.setattr(config, "CPU_FEATURES", "-avx512f,-avx2,-fma")
    assert database.host_isa.__wrapped__() == "generic"  # what Numba is told
    assert database.host_hardware_isa.__wrapped__() == real  # what the CPU is


def test_the_host_hardware_isa_from_linux_flags_is_llvms(monkeypatch):
    """An OpenCL process reads the CPU's tier from /proc/cpuinfo instead of importing LLVM's
    bindings (30-70 ms): both readings must give the same tier here, and Linux's flag
    names must map onto the tiers."""
    import importlib

    from llvmlite import binding as ll

    from tilegemm.backends.cpu import cpu_flags

    if cpu_flags() is None:
        pytest.skip("no feature list in /proc/cpuinfo here")
    llvm = database.isa_of(database.parse_features(ll.get_host_cpu_features().flatten()),
                           database.compiled_arch())
    assert database.host_hardware_isa.__wrapped__() == llvm
    flags = database.features_of_flags
    assert database.isa_of(flags(frozenset({"avx512f", "avx2", "fma"}), "x86_64"),
                           "x86_64") == "avx512"
    assert database.isa_of(flags(frozenset({"avx2", "fma"}), "x86_64"), "x86_64") == "avx2"
    assert database.isa_of(flags(frozenset({"avx2"}), "x86_64"), "x86_64") == "generic"
    assert database.isa_of(flags(frozenset({"fp", "asimd"}), "aarch64"), "aarch64") == "neon"
    assert database.isa_of(flags(frozenset({"fp"}), "aarch64"), "aarch64") == "generic"
    # where Linux lists no features, LLVM's reading is used
    monkeypatch.setattr(importlib.import_module("tilegemm.backends.cpu"), "cpu_flags",
                        lambda: None)
    assert database.host_hardware_isa.__wrapped__() == llvm


class _Spy(Exception):
    """Raised by the patched run: the test needs the choice, not the product."""


def _ran(monkeypatch, call) -> dict:
    """The rung and parameters the CPU backend was asked to run by ``call()``."""
    seen: dict = {}

    def spy(spec, params, prob, *args, **kwargs):
        seen.update(kernel=spec.name, params=dict(params))
        raise _Spy

    monkeypatch.setattr(get_backend("cpu"), "run", spy)
    with pytest.raises(_Spy):
        call()
    return seen


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("shape", [(8, 8, 8), (300, 200, 100)])
def test_plan_agrees_with_what_runs(dtype, shape, monkeypatch):
    m, n, k = shape
    a, b = np.ones((m, k), dtype), np.ones((k, n), dtype)
    planned = tilegemm.plan(a, b)
    seen = _ran(monkeypatch, lambda: tilegemm.matmul(a, b))
    assert (planned.backend, planned.kernel, planned.params) == ("cpu", seen["kernel"],
                                                                  seen["params"])
    assert planned.source in ("database (device)", "database (isa)", "default")
    assert ("small product" in planned.path) == (m * n * k <= k02_blocked.DIRECT_PRODUCT)
    assert planned.kernel in str(planned) and planned.source in str(planned)


def test_plan_names_every_cpu_path_as_the_compiled_code_chooses_it():
    """plan().path named only the small-product path; the vector path and the batch split
    were "". Checked against the compiled module's own tests (takes_gemv, splits_batch)."""
    import sys

    from tilegemm import registry
    from tilegemm.kernels.cpu._small_tile import few_split_bytes
    from tilegemm.kernels.cpu._threads import planned_threads

    a = np.ones((4, 4), np.float32)
    params = tilegemm.plan(a, a, kernel="blocked").params
    program = registry.get("blocked", "cpu").program(params, np.dtype("float32"))
    mod = sys.modules[program.__module__]
    cb = program.bound
    threads = planned_threads()
    shapes = [(1, 1, 4096, 4096), (1, 4096, 1, 4096), (1, 1, 1, 10**7), (64, 1, 300, 300),
              (64, 64, 64, 64), (4, 200, 200, 200), (64, 200, 200, 200), (1, 500, 500, 500),
              (2, 300, 300, 300), (3, 8, 8, 8), (1, 40, 40, 0), (1, 2048, 16, 2048),
              (1, 2048, 2, 4096), (3, 900, 8, 900), (1, 3000, 33, 3000), (1, 3000, 64, 3000),
              (1, 4, 1024, 1024), (1, 7, 4096, 4096), (2, 2, 300, 9000), (1, 8, 1024, 1024),
              (1, 3, 33, 5000), (1, 1, 1000, 1000), (1, 1000, 1, 1000), (1, 1, 50, 50),
              (1, 160, 160, 160), (1, 24, 300, 300), (1, 16, 4096, 256), (1, 384, 384, 384),
              (1, 385, 384, 384), (1, 4096, 64, 64), (1, 10, 2000, 2000), (1, 12, 1024, 1024),
              (1, 15, 999, 1000), (1, 9, 300, 400), (1, 20, 1000, 1000), (1, 17, 300, 400),
              (1, 24, 2048, 2048), (1, 32, 3000, 3000), (1, 39, 3000, 200), (1, 40, 3000, 200)]
    for batch, m, n, k in shapes:
        path = k02_blocked.path(batch, m, n, k, threads, params, itemsize=4)
        # products of one row or one column leave the calling thread sooner (their matrix
        # beyond this CPU's L2 share): the module's own limit, as ``blocked`` applies it
        direct = (mod.DIRECT_PRODUCT if m != 1 and n != 1
                  else min(mod.DIRECT_PRODUCT, program.vector_direct))
        small = k == 0 or batch * m * n * k <= direct
        assert ("small product" in path or "no K" in path) == small, (batch, m, n, k, path)
        if small:
            continue
        vector = bool(mod.takes_gemv(batch, m, n, k, direct))
        assert ("one row or column" in path) == vector, (batch, m, n, k, path)
        split = not vector and bool(mod.splits_batch(batch, m, n, k, threads))
        assert ("batch split" in path) == split, (batch, m, n, k, path)
        narrow = not vector and bool(mod.takes_rows(batch, m, n, k, threads, direct, 0, cb))
        assert ("rows split" in path) == narrow, (batch, m, n, k, path)
        assert ("narrow product" in path) == (narrow and n <= mod.NARROW_N), path
        # wider products take the rows path only where the CPU has the wide 8-row tile
        assert ("unpacked" in path) == (narrow and n > mod.NARROW_N), path
        assert not ("unpacked" in path and mod.DW8 == mod.SMALL_W), path
        few = not vector and not narrow and bool(mod.takes_few(batch, m, n, k, threads,
                                                               direct, 0))
        assert ("few rows" in path) == few, (batch, m, n, k, path)
        alone = few and k * n * 4 <= few_split_bytes(m, params["FEW_KB"])
        assert ("on the calling thread" in path) == alone, (batch, m, n, k, path)
        assert ("packed panels" in path) == (not vector and not split and not narrow
                                             and not few)
        # B handed over as its transpose (Fortran-ordered): dot products along K
        fortran = k02_blocked.path(batch, m, n, k, threads, params, itemsize=4,
                                   b_transposed=True)
        dots = not vector and not narrow and bool(mod.takes_few(batch, m, n, k, threads,
                                                                direct, 2))
        assert ("few rows" in fortran) == dots, (batch, m, n, k, fortran)
        # 2-15 rows; with the wide 8-row tile 16-39 rows of at most DOT_TILED_A_BYTES
        assert ("dot products" in fortran) == dots, (batch, m, n, k, fortran)
        # A handed over as its transpose: narrow and unpacked products are packed; B: the
        # narrow path copies it (a few columns), the unpacked one packs it
        flipped = k02_blocked.path(batch, m, n, k, threads, params, itemsize=4,
                                   a_transposed=True)
        if mod.swaps_narrow(m, n, 1):  # a few columns: computed as its transpose
            assert flipped == ("as its transpose, B.T @ A.T (A given transposed, few "
                               "columns): " + k02_blocked.path(
                                   batch, n, m, k, threads, params, itemsize=4,
                                   a_transposed=True)), (batch, m, n, k, flipped)
        else:
            assert ("rows split" in flipped) == (narrow and bool(mod.takes_rows(
                batch, m, n, k, threads, direct, 1, cb))), (batch, m, n, k, flipped)
            # few rows with A transposed: 2-7 rows copy A (a few rows), 8-15 are packed
            assert ("few rows" in flipped) == (few and m < 8), (batch, m, n, k, flipped)
        both = k02_blocked.path(batch, m, n, k, threads, params, itemsize=4,
                                a_transposed=True, b_transposed=True)
        assert "as its transpose" not in both + fortran, (batch, m, n, k, both)
        assert ("rows split" in fortran) == (narrow and bool(mod.takes_rows(
            batch, m, n, k, threads, direct, 2, cb))), (batch, m, n, k, fortran)
    planned = tilegemm.plan(np.ones((1, 3000), np.float32), np.ones((3000, 500), np.float32))
    assert "one row or column" in planned.path and "one row or column" in str(planned)
    x, w = np.ones((4, 3000), np.float32), np.ones((500, 3000), np.float32)
    assert "few rows" in tilegemm.plan(x, np.ascontiguousarray(w.T)).path
    assert "dot products" in tilegemm.plan(x, w.T).path  # W's rows read in place
    assert "few rows" in tilegemm.plan(np.asfortranarray(x), np.ascontiguousarray(w.T)).path


def test_tuned_cache_overrides_the_database(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    a = np.ones((256, 256), np.float32)
    assert tilegemm.plan(a, a).source != "tuned"
    dev = select.device_id(get_backend("cpu"))
    tcache.record(tcache.Entry(dev.backend, dev.name, dev.arch, "float32", [256, 256, 256],
                               "blocked", {"MR": 12, "NR": 8, "MC": 96, "KC": 256, "NC": 1024},
                               1e-3, 33.0))
    planned = tilegemm.plan(a, a)
    assert planned.source == "tuned" and planned.params["MR"] == 12
    assert planned.params["KC"] == 256


def test_named_rung_without_parameters_runs_this_devices_measured_ones(tmp_path, monkeypatch):
    """``kernel="blocked"`` alone gets what this machine measured for that rung (database,
    then the tuning cache), as ``kernel="auto"`` does: the rung's generic defaults can be
    half as fast (16x8 spills on AVX2). Parameters given by hand always win."""
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    a = np.ones((256, 256), np.float32)
    auto, named = tilegemm.plan(a, a), tilegemm.plan(a, a, kernel="blocked")
    assert auto.kernel == "blocked"
    assert (named.source, named.params) == (auto.source, auto.params)
    dev = select.device_id(get_backend("cpu"))

    def tuned(kernel: str, params: dict[str, int], gflops: float) -> None:
        tcache.record(tcache.Entry(dev.backend, dev.name, dev.arch, "float32", [256, 256, 256],
                                   kernel, params, 1e-3, gflops))

    tuned("triple_loop", {}, 99.0)  # the fastest entry, but for another rung
    tuned("blocked", {"MR": 12, "NR": 8, "MC": 96, "KC": 256, "NC": 1024}, 33.0)
    named = tilegemm.plan(a, a, kernel="blocked")
    assert named.source == "tuned" and (named.params["MR"], named.params["KC"]) == (12, 256)
    seen = _ran(monkeypatch, lambda: tilegemm.matmul(a, a, kernel="blocked"))
    assert seen == {"kernel": "blocked", "params": named.params}
    by_hand = tilegemm.plan(a, a, kernel="blocked", MR=4)  # one knob: the others as tuned
    assert by_hand.source == "requested; the others from tuned"
    assert (by_hand.params["MR"], by_hand.params["KC"]) == (4, 256)
    assert tilegemm.plan(a, a, kernel="triple_loop").source == "tuned"


def test_plan_requested_kernel_and_bad_input():
    a = np.ones((5, 7), np.float64)
    planned = tilegemm.plan(a, a.T, kernel="blocked", MR=4)
    # the other parameters: this machine's measured ones if it has some, else the defaults
    assert planned.source.startswith("requested") and planned.params["MR"] == 4
    assert planned.shape == (1, 5, 5, 7)
    with pytest.raises(ValueError, match="unknown kernel"):
        tilegemm.plan(a, a.T, kernel="nope", backend="cpu")
    with pytest.raises(ValueError):
        tilegemm.plan(a, a)  # 5x7 @ 5x7: shapes do not match


def test_plan_text_is_single_spaced_with_and_without_parameters():
    a = np.ones((5, 7), np.float64)
    plain = str(tilegemm.plan(a, a.T, kernel="triple_loop", backend="cpu"))
    assert plain.startswith("cpu:triple_loop (rung 1) [default] on cpu/")
    tiled = str(tilegemm.plan(a, a.T, kernel="blocked", MR=4))
    assert tiled.startswith("cpu:blocked (rung 2) MR=4 NR=")
    assert "  " not in plain and "  " not in tiled


@pytest.mark.cudasim
@pytest.mark.simulator
@pytest.mark.parametrize(("dtype", "kw"), [("bfloat16", {}), ("float16", {"dtype": "float32"}),
                                           ("float32", {"precision": "3xtf32"})])
def test_plan_agrees_with_what_runs_on_tensor_cores(dtype, kw, monkeypatch):
    a = np.ones((9, 16), dtype)
    planned = tilegemm.plan(a, a.T, backend="cuda", **kw)
    seen = {}

    def spy(spec, params, prob, *args, **kwargs):
        seen.update(kernel=spec.name, params=dict(params), dtype=prob.dtype.name)
        raise _Spy

    monkeypatch.setattr(get_backend("cuda"), "run", spy)
    with pytest.raises(_Spy):
        tilegemm.matmul(a, a.T, backend="cuda", **kw)
    assert (planned.kernel, planned.params, planned.dtype) == (
        "mma", seen["params"], seen["dtype"]) and seen["kernel"] == "mma"
    assert seen["dtype"] == dtype  # 16-bit operands reach the kernel as they are


@pytest.mark.parametrize(("features", "expected"), [
    ("+avx,+avx2,+fma,-avx512f,+sse4.2", "avx2"),
    ("+avx,+avx2,+fma,+avx512f,+avx512bw", "avx512"),
    ("+avx,+avx2,-fma", "generic"),  # AVX2 without FMA: the micro-kernel's FMAs would split
    ("", "generic"),
])
def test_host_isa_follows_the_features_numba_compiles_for(monkeypatch, features, expected):
    """``NUMBA_CPU_FEATURES`` (e.g. building AVX2 code on an AVX-512 machine) changes the
    code Numba emits, so the register tile must follow it, not the host's features."""
    from numba.core import config

    monkeypatch.setattr(config, "CPU_FEATURES", features)
    database.host_isa.cache_clear()
    try:
        assert database.host_isa() == expected
    finally:
        database.host_isa.cache_clear()


def _measured_blocked(monkeypatch, base: dict[str, int]) -> None:
    """This machine 'has' measured parameters ``base`` for the CPU rung named alone."""
    from tilegemm import api, registry

    spec = registry.get("blocked", "cpu")
    monkeypatch.setattr(api, "named_plan",
                        lambda be, target, prob, kernel: (spec, dict(base), "database (device)")
                        if kernel == "blocked" else None)


def test_one_parameter_by_hand_keeps_the_measured_others(monkeypatch):
    base = {"MR": 4, "NR": 16, "MC": 192, "KC": 384, "NC": 1024, "FEW_KB": 1024,
            "FEW_KC": 128, "UNPACKED_KB": 2048, "VECTOR_KB": 512}
    _measured_blocked(monkeypatch, base)
    a = np.ones((300, 300), np.float32)
    p = tilegemm.plan(a, a, kernel="blocked", KC=256)
    assert p.params == {**base, "KC": 256}
    assert p.source == "requested; the others from database (device)"


def test_a_hand_parameter_that_does_not_fit_the_measured_set_falls_back_to_defaults(
        monkeypatch):
    from tilegemm import api, registry

    _measured_blocked(monkeypatch, {"MR": 12, "NR": 32, "MC": 96, "KC": 384, "NC": 1024})
    # and no other entry for this CPU (an AVX2 one has 6x16 for every shape, which 16 x 16
    # fits: it would be taken, see the test above)
    monkeypatch.setattr(api, "unbounded_database_plan", lambda *args: [])
    a = np.ones((300, 300), np.float32)
    p = tilegemm.plan(a, a, kernel="blocked", MR=16)  # 16 x 32 breaks MR*NR <= 384
    assert p.params == {**registry.get("blocked", "cpu").defaults(), "MR": 16}
    assert p.source == "requested; the others are the defaults (database (device) ones do not fit)"


def test_every_parameter_by_hand_is_taken_as_given(monkeypatch):
    base = {"MR": 4, "NR": 16, "MC": 192, "KC": 384, "NC": 1024, "FEW_KB": 1024,
            "FEW_KC": 128, "UNPACKED_KB": 2048, "VECTOR_KB": 512}
    _measured_blocked(monkeypatch, base)
    a = np.ones((300, 300), np.float32)
    given = {"MR": 8, "NR": 8, "MC": 96, "KC": 128, "NC": 512, "FEW_KB": 2048, "FEW_KC": 256,
             "UNPACKED_KB": 4096, "VECTOR_KB": 1024}
    p = tilegemm.plan(a, a, kernel="blocked", **given)
    assert p.params == given and p.source == "requested"


def test_plan_names_the_call_arguments_it_does_not_take() -> None:
    """plan(a, b, out=x) was answered with the hint about UPPER-CASE rung parameters."""
    a = np.ones((2, 2))
    with pytest.raises(TypeError, match="plan\\(\\) takes no out: it does not change"):
        tilegemm.plan(a, a, out=a)
    with pytest.raises(TypeError, match="takes no alpha, beta: they do not"):
        tilegemm.plan(a, a, alpha=2.0, beta=1.0)


def test_blocked_register_tile_is_capped_by_bytes_for_eight_byte_types() -> None:
    """MR=12 NR=32 passed the MR*NR <= 384 check in int64 and float64, where the tile needs
    twice the registers: LLVM took about 2 minutes to compile the spilling loop."""
    for dtype in (np.int64, np.float64):
        a = np.ones((4, 4), dtype)
        with pytest.raises(ValueError, match=f"MR\\*NR = 384 does not fit the vector "
                                             f"registers in {np.dtype(dtype).name}"):
            tilegemm.plan(a, a, backend="cpu", kernel="blocked", MR=12, NR=32)
        assert tilegemm.plan(a, a, backend="cpu", kernel="blocked", MR=12, NR=16).params["MR"] == 12
    f = np.ones((4, 4), np.float32)
    assert tilegemm.plan(f, f, backend="cpu", kernel="blocked", MR=12, NR=32).params["NR"] == 32


def test_cpu_tuning_entries_are_keyed_by_the_cpus_model_and_isa(tmp_path, monkeypatch):
    """A tuning cache shared by several machines (a cluster's home directory) never hands a
    CPU entry to another ISA: the host CPU's key carries its family and model and its ISA
    (virtual machines name several generations alike), and its architecture tier is the
    ISA's. Entries of an older key (name alone, plain machine type) are not used."""
    from tilegemm.backends.cpu import cpu_family_model

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(select, "_device_ids", {})
    target = get_backend("cpu").target()
    isa = database.host_isa()
    dev = select.device_id(target)
    model = cpu_family_model()
    assert dev.name == f"{target.name} [{model + ', ' if model else ''}{isa}]"
    assert dev.arch == f"{target.arch}-{isa}"
    a = np.ones((256, 256), np.float32)
    params = {"MR": 4, "NR": 8, "MC": 96, "KC": 256, "NC": 1024}

    def record(name: str, arch: str, kc: int) -> None:
        tcache.record(tcache.Entry("cpu", name, arch, "float32", [256, 256, 256], "blocked",
                                   dict(params, KC=kc), 1e-3, 50.0))

    other = "generic" if isa != "generic" else "avx2"
    record(target.name, target.arch, 128)  # the key before the ISA was part of it
    record(f"{target.name} [{other}]", f"{target.arch}-{other}", 128)  # another ISA
    assert tilegemm.plan(a, a).source != "tuned"
    record("Another CPU [1-2, " + isa + "]", dev.arch, 512)  # same ISA, another model
    planned = tilegemm.plan(a, a)
    assert (planned.source, planned.params["KC"]) == ("tuned", 512)
    record(dev.name, dev.arch, 256)  # this very CPU: first, whatever the speeds
    assert tilegemm.plan(a, a).params["KC"] == 256
    # a GPU keeps its own name and architecture
    gpu = Target("cuda", "NVIDIA H100", "gpu", "sm_90", Limits(threads_per_block=1024),
                 "events")
    assert select.device_id(gpu) == tcache.DeviceId("cuda", "NVIDIA H100", "sm_90")


@pytest.mark.opencl
def test_an_opencl_cpu_devices_entries_have_an_architecture_tier(tmp_path, monkeypatch):
    """An entry ``tilegemm tune`` wrote for PoCL on another CPU of the same ISA was never
    used: PoCL's device names no architecture, so its key had none, and the architecture
    tier (device, then architecture, then the shipped database) was skipped."""
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(select, "_device_ids", {})
    target = get_backend("opencl").target()
    if target.kind != "cpu":
        pytest.skip("the default OpenCL device is not the host CPU")
    dev = select.device_id(target)
    assert dev.arch.endswith("-" + database.isa(target)) and dev.arch.split("-")[0]
    a = np.ones((256, 256), np.float32)
    before = tilegemm.plan(a, a, backend="opencl")
    other = {"BM": 8, "BN": 16, "BK": 8, "TM": 8, "TN": 16, "VW": 8}
    if before.params == {**before.params, **other}:
        other = {**other, "BN": 32, "TN": 32}
    tcache.record(tcache.Entry("opencl", "pthread-Another CPU [1-2, " + database.isa(target)
                               + "]", dev.arch, "float32", [256, 256, 256], before.kernel,
                               other, 1e-3, 50.0))
    after = tilegemm.plan(a, a, backend="opencl")
    assert after.source == "tuned" and after.params == {**after.params, **other}, after
    # this device's own entry, written before its key had an architecture, still comes first
    mine = {**other, "BK": 16 if other["BK"] != 16 else 8}
    tcache.record(tcache.Entry("opencl", dev.name, "", "float32", [256, 256, 256],
                               before.kernel, mine, 1e-3, 10.0))
    assert tilegemm.plan(a, a, backend="opencl").params["BK"] == mine["BK"]


def test_a_hand_parameter_that_breaks_a_bounded_entry_keeps_the_unbounded_one(monkeypatch):
    """MR=8 on a large float32 product, over the bounded 6x64 entry, breaks MR*NR <= 384:
    the others fell to the rung's defaults (NR=8, a much slower tile) where the device's
    entry for every shape (8x32) takes MR=8 as it is."""
    target = get_backend("cpu").target()
    base = {"backend": "cpu", "device": target.name, "isa": database.host_isa(),
            "dtype": "float32", "kernel": "blocked", "measured": "test"}
    table = ({**base, "params": {"MR": 8, "NR": 32, "MC": 96, "KC": 512, "NC": 2048}},
             {**base, "params": {"MR": 6, "NR": 64, "MC": 96, "KC": 512, "NC": 2048},
              "min_shape": {"n": 512}})
    monkeypatch.setattr(database, "entries", lambda path=database.PATH: table)
    monkeypatch.setattr(select, "_db_memo", {})
    monkeypatch.setattr(select, "_memo", {})
    monkeypatch.setattr(database, "host_family_model", lambda: "0-0")
    a = np.ones((1024, 1024), np.float32)
    p = tilegemm.plan(a, a, kernel="blocked", MR=8)
    assert (p.params["MR"], p.params["NR"]) == (8, 32)
    assert p.source == "requested; the others from database (device)"
    p = tilegemm.plan(a, a, kernel="blocked", KC=256)  # fits the bounded entry: kept
    assert (p.params["MR"], p.params["NR"], p.params["KC"]) == (6, 64, 256)
    assert p.source == "requested; the others from database (device; N >= 512)"
    p = tilegemm.plan(a, a, kernel="blocked", MR=16, MC=96)  # 16x32 and 16x64 break it
    assert p.params["NR"] == 8
    assert p.source == ("requested; the others are the defaults (database (device; "
                        "N >= 512) ones do not fit)")


def test_few_row_split_follows_the_parameter():
    """FEW_KB: a product of 2-7 rows whose B (2 MiB here) is within it runs on the calling
    thread, beyond it with its columns split over the threads; the same bits either way."""
    from tilegemm.reference import assert_close, random_operands

    a, b = random_operands((3, 256), (256, 2048), "float32")
    results = {}
    for few_kb, where in ((4096, "on the calling thread"), (2048, "on the calling thread"),
                         (1024, "columns split")):
        p = tilegemm.plan(a, b, kernel="blocked", FEW_KB=few_kb)
        assert p.params["FEW_KB"] == few_kb and where in p.path, (few_kb, p.path)
        program = registry.get("blocked", "cpu").program(p.params, np.dtype("float32"))
        assert program.bound[4] == few_kb * 1024  # FEW_KB, in bytes, as compiled code takes it
        results[few_kb] = tilegemm.matmul(a, b, kernel="blocked", FEW_KB=few_kb)
    assert_close(results[1024], a, b)
    np.testing.assert_array_equal(results[4096], results[1024])


def test_the_vector_thread_limit_is_set_per_cpu_model(monkeypatch):
    """The AVX2 AMD EPYC family 25 model 1's entries carry VECTOR_KB = 2048 (measured
    there, benchmarks/vector_threads.py) with the AVX2 tiles; another model under the same
    name takes the ISA's entries, which leave VECTOR_KB to the L2 rule, with the same tiles."""
    monkeypatch.setattr(database, "host_isa", lambda: "avx2")
    epyc = _target("AMD EPYC")
    for dtype in ("float32", "float64"):
        found = {}
        for fm in ("25-1", "25-8"):
            monkeypatch.setattr(database, "host_family_model", lambda fm=fm: fm)
            entry, tier = database.lookup(epyc, dtype, shape=(1, 1024, 1024))
            found[fm] = (dict(entry["params"]), tier)
        assert found["25-1"][1] == "device" and found["25-8"][1] == "isa"
        assert found["25-1"][0].pop("VECTOR_KB") == 2048 and "VECTOR_KB" not in found["25-8"][0]
        assert found["25-1"][0] == found["25-8"][0], dtype  # the same tile


def test_the_few_row_settings_serve_every_xeon_of_that_name(monkeypatch):
    """FEW_KB = 1024, FEW_KC = 64 and UNPACKED_KB = 1024, measured on the Intel Xeon family 6
    models 167 and 207 (both read B from L3 more slowly than the AMD Zen 5 where the
    defaults were measured), are in the entries for every CPU of that name; the Zen 5's
    entries keep the defaults."""
    monkeypatch.setattr(database, "host_isa", lambda: "avx512")
    xeon, epyc = _target("Intel(R) Xeon(R) Processor"), _target("AMD EPYC")
    settings = {"FEW_KB": 1024, "FEW_KC": 64, "UNPACKED_KB": 1024}
    for dtype, shape in (("float32", (1024, 1024, 1024)), ("float32", (3, 2048, 256)),
                         ("float64", (3, 2048, 256)), ("float64", (32, 1024, 1024))):
        for fm in ("6-167", "6-207", "6-143"):  # the two measured, and another model
            monkeypatch.setattr(database, "host_family_model", lambda fm=fm: fm)
            entry, tier = database.lookup(xeon, dtype, shape=shape)
            assert tier == "device", (dtype, shape, fm)
            assert {k: entry["params"].get(k) for k in settings} == settings, (dtype, fm)
        monkeypatch.setattr(database, "host_family_model", lambda: "26-2")
        entry, tier = database.lookup(epyc, dtype, shape=shape)
        assert tier == "device" and not settings.keys() & entry["params"].keys(), dtype
