"""Edge cases found by a QA pass: aliasing, array subclasses, scalars and c's dtype.

Each test here failed before the fix it accompanies (see the git log for the why).
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import tilegemm
from tilegemm.backends import get_backend
from tilegemm.reference import assert_close, random_operands

CPU = {"backend": "cpu", "kernel": "triple_loop"}


@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_out_aliasing_an_operand_gives_the_right_product(which):
    """``out=a`` (like NumPy's ``np.matmul(a, b, out=a)``) must not read a half-written a."""
    a, b = random_operands((6, 6), (6, 6), "float64")
    if which == "both":
        b = a
    x = (a if which != "b" else b).copy()
    args = (x, x) if which == "both" else ((x, b) if which == "a" else (a, x))
    r = tilegemm.matmul(*args, out=x, **CPU)
    assert r is x
    assert_close(x, a, b)


def test_out_aliasing_a_view_of_an_operand():
    """A batch of products written over one of its own inputs (a view, not the same object)."""
    a, b = random_operands((3, 5, 5), (3, 5, 5), "float32")
    x = a.copy()
    tilegemm.matmul(x, b, out=x[...], **CPU)
    assert_close(x, a, b)


def test_gemm_c_and_out_alias_an_operand():
    a, b = random_operands((5, 5), (5, 5), "float64")
    c = np.random.default_rng().uniform(0.5, 1.5, (5, 5))
    x = a.copy()
    tilegemm.gemm(x, b, x, alpha=2.0, beta=0.5, out=x, **CPU)
    assert_close(x, a, b, alpha=2.0, beta=0.5, c=a)
    x = a.copy()
    tilegemm.gemm(x, b, c, beta=0.5, out=x, **CPU)
    assert_close(x, a, b, beta=0.5, c=c)


@pytest.mark.cudasim
def test_device_out_aliasing_an_operand():
    from numba import cuda

    a, b = random_operands((6, 6), (6, 6), "float32")
    da, db = cuda.to_device(a), cuda.to_device(b)
    assert tilegemm.matmul(da, db, out=db, kernel="naive", BLOCK=8) is db
    assert_close(db.copy_to_host(), a, b)


@pytest.mark.cudasim
@pytest.mark.parametrize("where", ["out overlaps c in part", "out is c"])
def test_device_c_and_out_in_one_buffer_are_never_copied_onto_each_other(monkeypatch, where):
    """C0 went into out by a device-to-device copy even when out overlapped c in part (a
    copy between overlapping ranges is undefined in CUDA; the simulator's NumPy copy hid
    it) or was c itself (a copy onto itself). Now a partly overlapping out gets a fresh
    buffer, and c in place is not copied."""
    from numba import cuda
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    overlapping = []
    real = FakeCUDAArray.copy_to_device

    def copy(self, ary, stream=0):
        if isinstance(ary, FakeCUDAArray):
            overlapping.append(np.may_share_memory(np.asarray(self._ary), np.asarray(ary._ary)))
        return real(self, ary, stream)

    monkeypatch.setattr(FakeCUDAArray, "copy_to_device", copy)
    a, b = random_operands((6, 5), (5, 4), "float32")
    x = np.random.default_rng().uniform(0.5, 1.5, (7, 4)).astype(np.float32)
    dx = cuda.to_device(x)
    c, dc = (x[0:6], dx[0:6])
    dout = dx[1:7] if where == "out overlaps c in part" else dc
    got = tilegemm.gemm(a, b, dc, beta=0.5, out=dout, kernel="naive", BLOCK=8)
    assert got is dout
    assert_close(dout.copy_to_host(), a, b, beta=0.5, c=c)
    assert not any(overlapping), "a device copy between overlapping arrays"


@pytest.mark.cudasim
@pytest.mark.parametrize("case", ["row batch", "column batch", "empty, host c",
                                  "empty, device c"])
def test_c_broadcast_over_a_unit_axis_or_an_empty_result_on_cuda(case):
    """A host c read with beta != 0 was broadcast to the result with a zero stride on its
    size-1 axes, which NumPy still calls C-contiguous, so no dense copy was made and the
    simulator's copy to the device refused it (M = 1 in a batch); an empty result with
    beta != 0 copied nothing onto nothing, which the simulator also refused."""
    from numba import cuda

    rng = np.random.default_rng()
    if case.startswith("empty"):
        a, b = np.ones((0, 2), np.float32), rng.uniform(0.5, 1.5, (2, 3)).astype(np.float32)
        c = rng.uniform(0.5, 1.5, 3).astype(np.float32)
        given = cuda.to_device(np.zeros((0, 3), np.float32)) if "device" in case else c
        got = tilegemm.gemm(a, b, given, beta=0.5, backend="cuda", kernel="naive", BLOCK=8)
        got = got.copy_to_host() if "device" in case else got
        assert got.shape == (0, 3)
        return
    m, n = (1, 3) if case == "row batch" else (3, 1)
    a = rng.uniform(0.5, 1.5, (2, m, 4)).astype(np.float32)
    b = rng.uniform(0.5, 1.5, (2, 4, n)).astype(np.float32)
    c = rng.uniform(0.5, 1.5, (2, m, n)).astype(np.float32)
    for given in (c, c[:1], c[0, 0]):  # as it is, broadcast over the batch, one number
        got = tilegemm.gemm(a, b, given, beta=0.5, backend="cuda", kernel="naive", BLOCK=8)
        assert_close(got, a, b, beta=0.5, c=np.broadcast_to(given, (2, m, n)))


@pytest.mark.cudasim
def test_device_c_with_host_operands_gives_a_device_result():
    """A device c made api.check_out demand a device out, which run() then treated as a
    host array (a TypeError after the launch here; a device-to-host copy into a device
    pointer on a GPU). With any device input the result now stays on the device."""
    from numba import cuda

    a, b = random_operands((4, 5), (5, 3), "float32")
    c = np.random.default_rng().uniform(0.5, 1.5, (4, 3)).astype(np.float32)
    r = tilegemm.gemm(a, b, cuda.to_device(c), beta=0.5, kernel="naive", BLOCK=8)
    assert getattr(r, "__cuda_ndarray__", False)
    assert_close(r.copy_to_host(), a, b, beta=0.5, c=c)
    out = cuda.to_device(np.full((4, 3), np.nan, np.float32))
    assert tilegemm.gemm(a, b, cuda.to_device(c), beta=0.5, out=out, kernel="naive",
                         BLOCK=8) is out
    assert_close(out.copy_to_host(), a, b, beta=0.5, c=c)


@pytest.mark.cudasim
def test_transposed_and_strided_numba_operands():
    """trans_a on a numba array goes in as a strided view (on a GPU numba's .T would compile
    and launch a transpose kernel per call); a Fortran-ordered batch that cannot be viewed as
    (batch, rows, cols) without a copy is refused before the launch, out untouched."""
    from numba import cuda

    a, b = random_operands((5, 7), (5, 3), "float32")  # op(A) = a.T: (7, 5)
    r = tilegemm.gemm(cuda.to_device(a), cuda.to_device(b), trans_a=True, kernel="naive",
                      BLOCK=8)
    assert_close(r.copy_to_host(), a, b, trans_a=True)
    a4, b4 = random_operands((2, 3, 4, 5), (2, 3, 5, 2), "float64")
    out = cuda.to_device(np.full((2, 3, 4, 2), 7.0))
    with pytest.raises(ValueError, match="without a copy"):
        tilegemm.matmul(cuda.to_device(np.asfortranarray(a4)), cuda.to_device(b4), out=out,
                        kernel="naive", BLOCK=8)
    assert (out.copy_to_host() == 7.0).all()
    r = tilegemm.matmul(cuda.to_device(a4)[:, :, ::2], cuda.to_device(b4), kernel="naive",
                        BLOCK=8)  # strided rows on the device: viewed, no copy
    assert_close(r.copy_to_host().reshape(6, 2, 2), a4[:, :, ::2].reshape(6, 2, 5),
                 b4.reshape(6, 5, 2))


def test_device_span_covers_negative_strides_and_views():
    """The address-range test used on a real GPU (no GPU here: a stand-in with the same
    attributes as a numba DeviceNDArray)."""
    from types import SimpleNamespace

    from tilegemm.backends.cuda import _span

    def dev(ptr, shape, strides, itemsize=4):
        return SimpleNamespace(size=int(np.prod(shape)), shape=shape, strides=strides,
                               dtype=np.dtype(f"f{itemsize}"),
                               device_ctypes_pointer=SimpleNamespace(value=ptr))

    assert _span(dev(1000, (3, 4), (16, 4))) == (1000, 1048)
    assert _span(dev(1044, (3, 4), (-16, -4))) == (1000, 1048)  # [::-1, ::-1] of the above
    assert _span(dev(1000, (0, 4), (16, 4))) == (0, 0)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself warns
def test_matrix_and_masked_arrays_are_refused_clearly():
    """np.matrix used to reach Numba and fail with a TypingError; a masked array's mask was
    silently ignored. Both are refused up front, naming what to pass instead."""
    a, b = random_operands((4, 5), (5, 3), "float64")
    with pytest.raises(TypeError, match=r"np\.matrix.*np\.asarray"):
        tilegemm.matmul(np.matrix(a), b, **CPU)
    with pytest.raises(TypeError, match=r"masked.*filled"):
        tilegemm.matmul(a, np.ma.array(b, mask=b > 1), **CPU)
    c = np.ma.array(np.ones((4, 3)))
    with pytest.raises(TypeError, match="c: masked"):
        tilegemm.gemm(a, b, c, beta=1.0, **CPU)


def test_the_masked_array_check_imports_nothing():
    """Checking for a masked array imported ``numpy.ma`` (about 30 ms of a new process's
    first call, whose budget is 0.5 s); a module not imported cannot have made one."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, tilegemm; a = np.ones((8, 8)); tilegemm.plan(a, a); "
            "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[-1] == "False"


def test_other_ndarray_subclasses_compute_on_their_data():
    """The result is wrapped by the subclass, as np.matmul's is (__array_wrap__)."""
    class Tagged(np.ndarray):
        pass

    a, b = random_operands((4, 5), (5, 3), "float32")
    r = tilegemm.matmul(a.view(Tagged), b.view(Tagged), **CPU)
    assert type(r) is Tagged is type(np.matmul(a.view(Tagged), b.view(Tagged)))
    assert_close(r, a, b)
    out = np.empty((4, 3), np.float32).view(Tagged)
    assert tilegemm.matmul(a.view(Tagged), b, out=out, **CPU) is out
    assert_close(np.asarray(out), a, b)


def test_a_subclass_may_turn_a_vector_dot_product_into_a_scalar(tmp_path):
    """np.memmap's __array_wrap__ honours return_scalar, which NumPy passes for a 0-d
    result; tilegemm passed False and returned a 0-d array where np.matmul a scalar."""
    m = np.memmap(tmp_path / "x", np.float64, "w+", shape=(3,))
    m[:] = [1.5, -2.0, 3.0]
    ours, numpys = tilegemm.matmul(m, m, **CPU), np.matmul(m, m)
    assert type(ours) is type(numpys) is np.float64 and ours == numpys


@pytest.mark.parametrize("shapes", [((4, 5), (5, 3)), ((5,), (5,))])
def test_an_array_wrap_without_return_scalar_is_called_as_numpy_calls_it(shapes):
    """An __array_wrap__ written before NumPy 2 (no return_scalar argument): np.matmul
    calls it again without, with a DeprecationWarning; tilegemm computed the product and
    then raised TypeError."""
    import warnings

    class Old(np.ndarray):
        def __array_wrap__(self, obj, context=None):
            return obj.view(type(self))

    a, b = random_operands(*shapes, "float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        expected = np.matmul(a.view(Old), b)
    with pytest.warns(DeprecationWarning, match="return_scalar") as caught:
        got = tilegemm.matmul(a.view(Old), b, **CPU)
    assert caught[0].filename == __file__  # the caller's line, as NumPy names it
    assert type(got) is type(expected) is Old and got.shape == expected.shape
    assert_close(np.asarray(got), a, b)


def test_subclasses_with_their_own_array_ufunc_are_refused():
    """np.matmul hands such an array to its class (units multiplied, or refused with
    __array_ufunc__ = None); tilegemm computed the bare numbers and kept the operand's
    metadata, silently wrong. Refused as operands, out and c, leaving out untouched."""
    class NoUfunc(np.ndarray):
        __array_ufunc__ = None

    class Units(np.ndarray):
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            plain = [np.asarray(x) if isinstance(x, Units) else x for x in inputs]
            return getattr(ufunc, method)(*plain, **kwargs).view(Units)

    a, b = random_operands((4, 5), (5, 3), "float64")
    for cls in (NoUfunc, Units):
        for args in ((a.view(cls), b), (a, b.view(cls))):
            with pytest.raises(TypeError, match=f"{cls.__name__} defines its own "
                               r"__array_ufunc__.*np\.asarray"):
                tilegemm.matmul(*args, **CPU)
        out = np.full((4, 3), np.nan).view(cls)
        with pytest.raises(TypeError, match="out: "):
            tilegemm.matmul(a, b, out=out, **CPU)
        assert np.isnan(np.asarray(out)).all()
        with pytest.raises(TypeError, match="c: "):
            tilegemm.gemm(a, b, np.ones((4, 3)).view(cls), beta=1.0, **CPU)
    # an array_ufunc inherited from ndarray is not an override: memmap, recarray...
    assert_close(tilegemm.matmul(a.view(np.recarray), b, **CPU), a, b)


def test_other_objects_with_their_own_array_ufunc_are_refused():
    """Not only subclasses: a duck array carrying units (pint-like) lost them, and one with
    __array_ufunc__ = None, which np.matmul refuses, was multiplied. Objects that only
    offer __array__ (or the buffer protocol) are still taken as NumPy takes them."""
    a, b = random_operands((4, 5), (5, 3), "float64")

    class Duck:
        def __init__(self, x):
            self.x = x

        def __array__(self, dtype=None, copy=None):
            return self.x

    class NoUfunc(Duck):
        __array_ufunc__ = None

    class Units(Duck):
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            return "m^2", getattr(ufunc, method)(*[getattr(x, "x", x) for x in inputs])

    for cls in (NoUfunc, Units):
        with pytest.raises(TypeError, match=f"{cls.__name__} defines its own __array_ufunc__"):
            tilegemm.matmul(cls(a), b, **CPU)
        with pytest.raises(TypeError, match="b: "):
            tilegemm.matmul(a, cls(b), **CPU)
    assert_close(tilegemm.matmul(Duck(a), Duck(b), **CPU), a, b)


@pytest.mark.parametrize(("result", "c"), [
    (np.bool_, np.int32),  # bool is computed in int32: a count 2 plus c=-2 came out False
    (np.uint8, np.int64),  # -1 wrapped to 255 where NumPy refuses the cast
    (np.bool_, np.float64),
])
def test_c_is_checked_against_the_result_dtype_not_the_computed_one(result, c):
    a = np.ones((2, 2), result)
    cc = np.full((2, 2), -2, c)
    with pytest.raises(TypeError, match=f"result dtype {np.dtype(result).name}, computed in"):
        tilegemm.gemm(a, a, cc, beta=1, **CPU)
    assert (cc == -2).all()


@pytest.mark.parametrize("alpha", [np.complex64(1), np.complex128(2 + 0j), 1 + 0j])
def test_complex_scalars_are_refused(alpha):
    """NumPy complex scalars used to pass the check and lose their imaginary part."""
    a, b = random_operands((3, 4), (4, 2), "float64")
    with pytest.raises(TypeError, match="alpha must be real"):
        tilegemm.gemm(a, b, alpha=alpha, **CPU)
    with pytest.raises(TypeError, match="beta must be real"):
        tilegemm.gemm(a, b, np.ones((3, 2)), beta=alpha, **CPU)


@pytest.mark.parametrize(
    ("alpha", "error", "match"),
    [(float("nan"), TypeError, "alpha=nan must be an integer"),
     (float("inf"), TypeError, "alpha=inf must be an integer"),
     (2.5, TypeError, "alpha=2.5 must be an integer"),
     (2**40, ValueError, "alpha=1099511627776 does not fit in int32"),
     # other number types, converted exactly (a Fraction beyond any float raised
     # OverflowError; a signalling NaN decimal.InvalidOperation)
     (Fraction(10**400), ValueError, r"does not fit in int32"),
     (Fraction(3, 2), TypeError, r"alpha=Fraction\(3, 2\) must be an integer"),
     (Decimal("1e400"), ValueError, "does not fit in int32"),
     (Decimal("sNaN"), ValueError, "is a signalling NaN")],
)
def test_integer_products_name_a_bad_alpha(alpha, error, match):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    with pytest.raises(error, match=match):
        tilegemm.gemm(a, a.T, alpha=alpha, **CPU)


def test_integer_product_accepts_integral_float_scalars():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(tilegemm.gemm(a, a.T, a[:, :2], alpha=2.0, beta=-1.0, **CPU),
                                  2 * (a @ a.T) - a[:, :2])
    np.testing.assert_array_equal(
        tilegemm.gemm(a, a.T, a[:, :2], alpha=Decimal(2), beta=Fraction(-1), **CPU),
        2 * (a @ a.T) - a[:, :2])


@pytest.mark.parametrize("alpha", [Fraction(10**400), Decimal("1e400"), Decimal("sNaN")])
def test_float_products_refuse_numbers_no_float_holds(alpha):
    """Decimal("1e400") became inf silently (10**400 was refused); a signalling NaN raised
    decimal.InvalidOperation from a comparison inside gemm."""
    a, b = random_operands((3, 4), (4, 2), "float64")
    with pytest.raises(ValueError, match="too large for a float64 product|signalling NaN"):
        tilegemm.gemm(a, b, alpha=alpha, **CPU)
    assert tilegemm.gemm(a, b, alpha=Decimal("Infinity"), **CPU).dtype == np.float64


@pytest.mark.parametrize(
    ("ab", "c"),
    [("float64", np.complex128), ("int32", np.float64), ("int64", np.float32)],
)
def test_c_that_cannot_be_cast_to_the_result_is_refused(ab, c):
    """A complex c lost its imaginary part and a float c was truncated into an integer
    product, silently; c now follows NumPy's same_kind rule, as out= does in ufuncs."""
    a, b = random_operands((3, 4), (4, 2), ab)
    cc = np.full((3, 2), 1.5, dtype=c)
    with pytest.raises(TypeError, match=f"c: dtype {np.dtype(c).name} cannot be cast"):
        tilegemm.gemm(a, b, cc, beta=1, **CPU)


def test_c_of_a_wider_kind_is_cast_down():
    a, b = random_operands((3, 4), (4, 2), "float32")
    c = np.random.default_rng().uniform(0.5, 1.5, (3, 2))  # float64 → float32: same kind
    r = tilegemm.gemm(a, b, c, beta=0.5, **CPU)
    assert r.dtype == np.float32
    assert_close(r, a, b, beta=0.5, c=c)


def test_vector_dot_vector_out_is_written_and_returned():
    a, b = random_operands((7,), (7,), "float64")
    out = np.full((), np.nan)
    assert tilegemm.matmul(a, b, out=out, **CPU) is out
    assert_close(out, a, b)


def test_read_only_inputs_do_not_compile_the_rung_again(monkeypatch):
    """A read-only operand (np.load(mmap_mode='r'), np.broadcast_to, frombuffer) is a
    different Numba type from a writeable one: each mix of the two compiled the CPU rung
    again. Operands now always reach kernels as read-only views: one build per dtype.
    Counted on a program of its own, built for this test (the process's shared one may
    have been compiled for other mixes by earlier tests). Repeated calls, which run the
    remembered program on the caller's arrays as they are (tilegemm.fastpath), compiled it
    again for writeable operands until the rung declared its one signature."""
    from tilegemm import registry

    real = registry._build
    fresh = registry._build.__wrapped__(registry.get("triple_loop", "cpu"), (), "int32")

    def build(spec, params, dtype):
        if spec.name == "triple_loop" and spec.backend == "cpu" and dtype == "int32":
            return fresh
        return real(spec, params, dtype)

    monkeypatch.setattr(registry, "_build", build)
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    ro = a.copy()
    ro.flags.writeable = False
    for x, y in ((a, a.T), (ro, a.T), (a, ro.T), (ro, ro.T), (a, a.T.copy()), (ro, ro.T.copy())):
        for _ in range(2):
            np.testing.assert_array_equal(tilegemm.matmul(x, y, **CPU), a @ a.T)
    assert len(fresh.signatures) == 1


def _readme_use_block(keep_cuda: bool) -> str:
    """The README's 'Use' example, at small sizes (the simulator is slow), optionally without
    its backend="cuda" line (which needs a GPU or the simulator)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    block = block.replace("rand(1000, 700)", "rand(10, 7)").replace("rand(700, 300)",
                                                                    "rand(7, 3)")
    assert "rand(10, 7)" in block and "rand(7, 3)" in block, "README example changed shape"
    lines = [ln for ln in block.splitlines() if keep_cuda or 'backend="cuda"' not in ln]
    if not get_backend("opencl").status().usable:  # a GPU machine without PyOpenCL
        lines = [ln for ln in lines if 'backend="opencl"' not in ln]
    return "\n".join(lines)


def test_readme_example_runs():
    """It reused c = matmul(a[None], b) (shape (1, M, N)) as gemm's c for a 2-D result."""
    exec(compile(_readme_use_block(keep_cuda=False), "README.md", "exec"), {})


@pytest.mark.cudasim
def test_readme_example_cuda_lines_run_on_the_simulator():
    """Only the example's setup and its backend="cuda" lines (the rest runs in
    test_readme_example_runs): run whole, the example compiled every CPU rung it names
    again in the simulator's test process, 100 s for nothing new."""
    block = _readme_use_block(keep_cuda=True)
    cuda_lines = [ln for ln in block.splitlines() if 'backend="cuda"' in ln]
    if not cuda_lines:
        pytest.skip('the README example has no backend="cuda" line')
    setup = [ln for ln in block.splitlines() if ln.startswith(("import ", "a = ", "b = "))]
    exec(compile("\n".join(setup + cuda_lines), "README.md", "exec"), {})


def test_c_is_checked_even_when_beta_is_zero():
    """A wrong c passed with beta=0 was accepted silently and raised only once beta changed:
    c is still never read when beta == 0, but its shape and dtype are always checked."""
    a, b = random_operands((3, 4), (4, 2), "float64")
    with pytest.raises(ValueError, match="does not broadcast"):
        tilegemm.gemm(a, b, np.ones((5, 5)), beta=0.0, **CPU)
    with pytest.raises(TypeError, match="cannot be cast"):
        tilegemm.gemm(a, b, np.ones((3, 2), complex), beta=0.0, **CPU)
    r = tilegemm.gemm(a, b, np.full((3, 2), np.nan), beta=0.0, **CPU)  # still not read
    assert_close(r, a, b)


def test_out_that_is_not_an_array_says_so():
    """A list out= was reported as a dtype mismatch; it is a TypeError, as in NumPy."""
    a, b = random_operands((2, 2), (2, 2), "float64")
    with pytest.raises(TypeError, match=r"out: must be a numpy\.ndarray, got list"):
        tilegemm.matmul(a, b, out=[[0, 0], [0, 0]], **CPU)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_overflow_wraps_exactly_like_numpy(dtype):
    """Documented behaviour (README 'Dtypes'): integer products wrap modulo 2**bits as
    NumPy's do, so results equal np.matmul's bit for bit even when they overflow."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng()
    a = rng.integers(info.max // 4, info.max, (5, 7), dtype=dtype)
    b = rng.integers(info.max // 4, info.max, (7, 3), dtype=dtype)
    with np.errstate(over="ignore"):
        expected = a @ b
    np.testing.assert_array_equal(tilegemm.matmul(a, b, **CPU), expected)


@pytest.mark.parametrize("kwarg", [{"out_dtype": "float64"}, {"kernal": "triple_loop"},
                                   {"Backend": "cpu"}])
def test_unknown_keywords_are_not_taken_for_kernel_parameters(kwarg):
    """matmul(a, b, out_dtype=...) or a typo like kernal= said 'parameters ... need an explicit
    kernel='; rung parameters are UPPER-CASE, anything else is an unexpected keyword."""
    a, b = random_operands((2, 3), (3, 2), "float32")
    name = next(iter(kwarg))
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        tilegemm.matmul(a, b, **kwarg)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        tilegemm.gemm(a, b, **kwarg)


def test_out_as_a_one_element_tuple_as_numpy_accepts_it():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    o = np.empty((2, 2))
    assert tilegemm.matmul(a, a.T, out=(o,)) is o
    np.testing.assert_array_equal(o, np.matmul(a, a.T))
    # any other length is a ValueError, as NumPy's (it was a TypeError about the tuple)
    for bad in ((o, o), ()):
        with pytest.raises(ValueError, match="exactly one entry"):
            tilegemm.matmul(a, a.T, out=bad)
    # gemm takes the same form (it said "a host array cannot receive...")
    o[...] = np.nan
    assert tilegemm.gemm(a, a.T, out=(o,)) is o
    np.testing.assert_array_equal(o, np.matmul(a, a.T))


@pytest.mark.opencl  # the listing needs a usable device; the CUDA twin uses fake GPUs
@pytest.mark.parametrize("device", ["0", 0.0, True])
def test_a_device_that_is_not_an_int_is_named_as_such(device):
    """device="0" was refused as an unknown device while the listing showed device 0."""
    a = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="device= takes an int index, not"):
        tilegemm.plan(a, a, backend="opencl", device=device)



def test_a_bfloat16_scalar_is_a_real_number():
    """alpha=ml_dtypes.bfloat16(0.5) was refused as 'must be a real number, got 0.5'."""
    import ml_dtypes

    a, b = random_operands((3, 4), (4, 2), "float32")
    r = tilegemm.gemm(a, b, alpha=ml_dtypes.bfloat16(0.5), **CPU)
    assert_close(r, a, b, alpha=0.5)


@pytest.mark.parametrize("backend", [b.name for b in tilegemm.backends()
                                     if b.usable and b.name in ("cpu", "opencl")])
def test_float16_scalars_are_rounded_to_the_result_as_on_tensor_cores(backend):
    """A float16 result summed in float32: alpha and beta were float32 here and rounded to
    float16 on CUDA's tensor cores, so one call gave 100.06 here and inf there. Both now
    round them to the result's dtype, as NumPy rounds a Python number times a float16
    array."""
    a = np.array([[1e-3, 0], [0, 1]], np.float16)
    eye = np.eye(2, dtype=np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.float16(1e5) * (a.astype(np.float32) @ eye).astype(np.float16)
        got = tilegemm.gemm(a, eye, alpha=1e5, backend=backend)
    np.testing.assert_array_equal(got, want)  # inf, and inf * 0 = NaN
    three = np.full((1, 1), 3, np.float16)
    got = tilegemm.gemm(three, np.ones((1, 1), np.float16), alpha=0.1, backend=backend)
    assert got.dtype == np.float16 and got[0, 0] == np.float16(0.1 * three)[0, 0]  # 0.2998
    got = tilegemm.gemm(eye, eye, three.repeat(2, 0).repeat(2, 1), beta=0.1, backend=backend)
    assert got[0, 1] == np.float16(0.1 * three)[0, 0]
