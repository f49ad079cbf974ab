"""NumPy's rules at the edges of the API: operands cast to a narrow result dtype before the
product, alpha and beta checked against the caller's result dtype, a device ``c`` choosing
where the call runs, sizes this machine cannot hold refused before anything is allocated,
and errors that name what the caller wrote (``device=`` with a CPU-only rung, a byte-swapped
``dtype=``, an unusable ``PYOPENCL_CTX``). ``plan`` refuses what the call refuses."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import tilegemm
from conftest import script_json
from tilegemm.backends import get_backend
from tilegemm.errors import InvalidTypeError, InvalidValueError, UnavailableError

HOST = ["cpu"] + (["opencl"] if get_backend("opencl").status().usable else [])
needs_opencl = pytest.mark.skipif("opencl" not in HOST, reason="no usable OpenCL device")


# --- operands rounded through a narrow result dtype ------------------------------------------

@pytest.mark.parametrize("backend", HOST)
@pytest.mark.parametrize("result", [np.float16, ml_dtypes.bfloat16])
def test_operands_are_rounded_to_a_narrow_result_dtype_first(backend: str, result) -> None:
    """np.matmul(float32, float32, dtype=float16) casts the operands to float16, then
    multiplies: 1.00048 becomes 1.0 and the sum is exactly 0. Computing on the float32
    values (the kernel's dtype) and rounding only the sum gave 0.00048."""
    a = np.array([[1.00048, -1.0]], np.float32)
    b = np.ones((2, 1), np.float32)
    got = tilegemm.matmul(a, b, dtype=result, backend=backend)
    assert got.dtype == np.dtype(result)
    assert float(got[0, 0]) == 0.0

    rng = np.random.default_rng(11)
    a = rng.standard_normal((5, 37, 29), np.float32) * 3
    b = rng.standard_normal((29, 13), np.float32) * 3
    got = tilegemm.matmul(a, b, dtype=result, backend=backend).astype(np.float64)
    rounded = [x.astype(result).astype(np.float64) for x in (a, b)]
    want = np.matmul(*rounded)  # float64 sums of the rounded operands
    # one rounding of the sum to the result dtype, plus float32 accumulation
    eps = float(ml_dtypes.finfo(result).eps)
    np.testing.assert_allclose(got, want, rtol=eps, atol=eps * np.abs(want).max())
    # and the unrounded operands would be measurably off on the first case (negative control)
    assert np.abs(np.matmul(a.astype(np.float64), b.astype(np.float64)) - want).max() > eps


@pytest.mark.parametrize("backend", HOST)
def test_gemm_rounds_c_to_a_float16_result(backend: str) -> None:
    """c is cast to the result dtype (same_kind): a float32 c with float16 operands is
    rounded to float16 before beta*c is added, as the docstring promises."""
    got = tilegemm.gemm(np.float16([[1]]), np.float16([[-1]]), np.float32([[1.00048]]),
                        beta=1.0, backend=backend)
    assert got.dtype == np.float16 and float(got[0, 0]) == 0.0


def test_float8_e5m2_gives_what_numpy_gives() -> None:
    """ml_dtypes' float8_e5m2 reports kind "f" (the others "V"); np.matmul returns float32
    for it, and so must tilegemm (it was refused as an uncomputed float8 result)."""
    e5m2 = np.dtype(ml_dtypes.float8_e5m2)
    x = (np.arange(12, dtype=np.float32).reshape(3, 4) / 4).astype(e5m2)
    got = tilegemm.matmul(x, x.T)
    want = np.matmul(x, x.T)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_byte_swapped_dtype_is_refused_saying_why() -> None:
    a = np.ones((2, 2))
    with pytest.raises(InvalidTypeError, match="non-native byte order.*give the type alone "
                                               r"\(float64\)"):
        tilegemm.matmul(a, a, dtype=">f8")


# --- alpha and beta ----------------------------------------------------------------------------

def test_unsigned_alpha_is_checked_against_the_callers_dtype() -> None:
    u = np.arange(1, 10, dtype=np.uint64).reshape(3, 3)
    big = np.uint64(2**64 - 1)  # int64's -1 once wrapped: the same products modulo 2**64
    np.testing.assert_array_equal(tilegemm.gemm(u, u, alpha=big, backend="cpu"), big * (u @ u))
    u32 = u.astype(np.uint32)
    np.testing.assert_array_equal(tilegemm.gemm(u32, u32, alpha=2**31, backend="cpu"),
                                  np.uint32(2**31) * (u32 @ u32))
    u8 = u.astype(np.uint8)
    with pytest.raises(InvalidValueError, match="alpha=-1 does not fit in uint8"):
        tilegemm.gemm(u8, u8, alpha=-1, backend="cpu")  # as np.uint8(-1) refuses it


def test_numpy_typed_scalars_are_checked_like_python_ones() -> None:
    """An np.int32 alpha is the type an int8/uint8 product is computed in: it must still fit
    the caller's dtype (300 wrapped silently to 44 when the check was skipped for it)."""
    u8 = np.ones((2, 2), np.uint8)
    with pytest.raises(InvalidValueError, match=r"alpha=np.int32\(300\) does not fit in uint8"):
        tilegemm.gemm(u8, u8, np.zeros((2, 2), np.uint8), alpha=np.int32(300),
                      beta=np.int32(0), backend="cpu")
    u64 = np.ones((2, 2), np.uint64)
    with pytest.raises(InvalidValueError, match="does not fit in uint64"):
        tilegemm.gemm(u64, u64, alpha=np.int64(-1), beta=np.int64(0), backend="cpu")


def test_an_overflowing_alpha_warns_once_at_the_callers_line() -> None:
    import warnings

    a = np.ones((2, 2), np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = tilegemm.gemm(a, a, alpha=1e300, backend="cpu")
    assert np.isinf(got).all()  # as NumPy: float32(1e300) is inf
    overflow = [w for w in caught if "overflow" in str(w.message)]
    assert len(overflow) == 1 and overflow[0].filename == __file__


def test_an_alpha_beyond_any_float_is_a_usage_error() -> None:
    for dtype in (np.float32, np.int32):
        a = np.ones((2, 2), dtype)
        with pytest.raises(InvalidValueError, match=r"alpha=10+\.\.\.0+ \(401 characters\)"):
            tilegemm.gemm(a, a, alpha=10**400, backend="cpu")


@pytest.mark.parametrize("backend", HOST)
def test_alpha_and_beta_scale_the_bool_product_not_the_counts(backend: str) -> None:
    """A bool result is computed as int32 counts of true products; alpha and beta scaled
    the counts: 2**30 × 4 true products wrapped to 0 (False), and 2 true products minus a
    true c was 1 (True) where True - True is False. Now as NumPy evaluates
    (alpha * (a @ b) + beta * c).astype(bool), on random data too, into out as well."""
    def want(a, b, c, alpha, beta):
        total = alpha * np.matmul(a, b).astype(np.int64)
        return total + beta * np.asarray(c, np.int64) != 0 if beta else total != 0

    ones = lambda *shape: np.ones(shape, bool)  # noqa: E731
    for a, b, c, alpha, beta in ((ones(1, 4), ones(4, 1), None, 2**30, 0),
                                 (ones(1, 2), ones(2, 1), None, -2**31, 0),
                                 (ones(1, 2), ones(2, 1), ones(1, 1), 1, -1),
                                 (ones(1, 3), ones(3, 1), ones(1, 1), 1, -3)):
        got = tilegemm.gemm(a, b, c, alpha=alpha, beta=beta, backend=backend)
        assert got.dtype == bool and (got == want(a, b, c, alpha, beta)).all(), (alpha, beta)
    rng = np.random.default_rng()
    a, b = rng.random((3, 7, 9)) < 0.3, rng.random((9, 5)) < 0.3
    c = rng.random(5) < 0.5  # broadcast over the result
    for alpha, beta in ((2, -1), (-1, 1), (0, 1), (3, 0), (1, 1), (1, 0)):
        out = np.zeros((3, 7, 5), bool)
        got = tilegemm.gemm(a, b, c, alpha=alpha, beta=beta, out=out, backend=backend)
        assert got is out and (out == want(a, b, c, alpha, beta)).all(), (alpha, beta)


def test_messages_name_the_callers_dtype_not_the_computed_one() -> None:
    b = np.ones((2, 2), bool)
    with pytest.raises(InvalidTypeError, match="alpha=0.5 must be an integer for a bool"):
        tilegemm.gemm(b, b, alpha=0.5, backend="cpu")
    spec = next(s for s in tilegemm.kernels() if "int32" not in s.dtypes
                and get_backend(s.backend).status().usable)
    i8 = np.ones((2, 2), np.int8)
    with pytest.raises(InvalidTypeError,
                       match=r"does not support dtype int8 \(computed as int32\)"):
        tilegemm.matmul(i8, i8, kernel=spec.name, backend=spec.backend)
    with pytest.raises(InvalidTypeError, match="float32 operands; int8 products support"):
        tilegemm.matmul(i8, i8, precision="tf32")


# --- a device c, device= ------------------------------------------------------------------------

@needs_opencl
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_a_device_c_chooses_opencl_whatever_beta_is(beta: float) -> None:
    import pyopencl.array as cla

    from tilegemm.backends.opencl import OpenCLBackend

    queue = OpenCLBackend().own_device().queue
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((7, 5), np.float32), rng.standard_normal((5, 3), np.float32))
    c_host = rng.standard_normal((7, 3), np.float32)
    c = cla.to_device(queue, c_host)
    got = tilegemm.gemm(a, b, c, beta=beta)
    assert isinstance(got, cla.Array)
    want = a.astype(np.float64) @ b + beta * c_host
    np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidValueError, match="operands are opencl arrays but backend='cpu'"):
        tilegemm.gemm(a, b, c, beta=beta, backend="cpu")
    c64 = cla.to_device(queue, c_host.astype(np.float64))
    with pytest.raises(InvalidTypeError, match="device c has dtype float64"):
        tilegemm.gemm(a, b, c64, beta=beta)
    np.testing.assert_array_equal(c.get(), c_host)  # untouched


@needs_opencl
def test_device_with_a_cpu_only_rung_says_so() -> None:
    a = np.ones((3, 3), np.float32)
    for call in (tilegemm.matmul, tilegemm.plan):
        with pytest.raises(InvalidValueError) as err:
            call(a, a, kernel="blocked", device=0)
        text = str(err.value)
        assert "which has no rung 'blocked'" in text and "leave device= out" in text
        assert "usable" not in text  # OpenCL is usable here: the rung is what is missing


# --- plan refuses what the call refuses -------------------------------------------------------

@pytest.mark.parametrize("flag", [1, "no"])
def test_plan_refuses_transpose_flags_that_are_not_booleans(flag) -> None:
    a = np.ones((3, 3), np.float32)
    for call in (tilegemm.plan, tilegemm.gemm):
        with pytest.raises(InvalidTypeError, match="trans_a must be True or False"):
            call(a, a, trans_a=flag)


@pytest.mark.parametrize("backend", HOST)
def test_a_product_larger_than_memory_is_refused_before_any_allocation(backend: str) -> None:
    """A broadcast row standing for 2**36 columns would be copied (512 GiB each operand):
    refused with the sizes, by plan and by the call alike, before anything is allocated."""
    one = np.ones((1, 1), np.float32)
    a, b = np.broadcast_to(one, (2, 2**36)), np.broadcast_to(one, (2**36, 2))
    for call in (tilegemm.plan, tilegemm.matmul):
        with pytest.raises(InvalidValueError, match="GiB"):
            call(a, b, backend=backend)


@pytest.mark.parametrize("backend", HOST)
def test_an_empty_product_reads_no_operand_however_large(backend: str) -> None:
    """No element to compute (M, N or the batch 0): neither operand is read, so none is
    copied or uploaded. A broadcast B standing for 10**6 x 10**6 elements was counted
    (refused: "needs 3725.3 GiB"), and a strided one was copied, for a (0, N) result."""
    one = np.ones((1, 1), np.float32)
    b = np.broadcast_to(one, (10**6, 10**6))
    cases = [(np.ones((0, 10**6), np.float32), b, (0, 10**6)),
             (np.broadcast_to(one, (10**6, 10**6)), np.ones((10**6, 0), np.float32),
              (10**6, 0)),
             (np.ones((0, 3, 10**6), np.float32), b, (0, 3, 10**6))]
    for a, bb, shape in cases:
        chosen = tilegemm.plan(a, bb, backend=backend)
        assert chosen.backend == backend
        c = tilegemm.matmul(a, bb, backend=backend)
        assert c.shape == shape and c.dtype == np.float32
    c = np.empty((7, 0), np.float32)  # out= and beta, as gemm takes them
    assert tilegemm.gemm(b[:7], b[:, :0], c, beta=2.0, out=c, backend=backend) is c


def test_cpu_memory_check_counts_only_the_copies_it_makes(monkeypatch) -> None:
    """C-ordered (or Fortran-ordered) operands of the computed dtype are read in place and a
    result written into a C-ordered ``out`` needs nothing; any other operand is counted as
    the copy it needs. Checked with the machine's memory set between the two totals."""
    from tilegemm.backends import cpu
    from tilegemm.problem import describe, make_problem

    be = get_backend("cpu")
    a = np.ones((64, 64))
    result = a.nbytes
    monkeypatch.setattr(cpu, "physical_memory", lambda: result + a.nbytes // 2)

    def check(x, y, out=None):
        ops = [describe(x, "a"), describe(y, "b")]
        be.check_problem(ops, make_problem(*ops), be.target(), out)

    check(a, a)  # read in place: the result alone fits
    check(a, np.asfortranarray(a))
    for copied in (a[:, ::-1], a.astype(np.float32), np.broadcast_to(a[:1], a.shape)):
        with pytest.raises(InvalidValueError, match="more than this machine has"):
            check(a, copied)  # + a copy of 32 KiB: over
    monkeypatch.setattr(cpu, "physical_memory", lambda: a.nbytes // 2)
    with pytest.raises(InvalidValueError, match="or pass out="):
        check(a, a)  # the result alone is over
    check(a, a, out=np.empty((64, 64)))  # written into out: nothing allocated
    check(a, np.asfortranarray(a), out=np.empty((64, 64)))
    for through_a_temporary in (np.empty((1, 64, 64)), np.empty((64, 64), np.float32)):
        with pytest.raises(InvalidValueError, match="more than this machine has"):
            check(a, a, out=through_a_temporary)  # the result is computed apart, then copied
    # int8 is computed in int32 (two 16 KiB operand copies, a 16 KiB result) and cast into
    # a new int8 array (4 KiB more), which was not counted; an int8 out= takes the cast
    i8 = np.ones((64, 64), np.int8)
    monkeypatch.setattr(cpu, "physical_memory", lambda: 3 * 64 * 64 * 4 + 2048)
    with pytest.raises(InvalidValueError, match="more than this machine has"):
        check(i8, i8)
    check(i8, i8, out=np.empty((64, 64), np.int8))


@needs_opencl
def test_plan_takes_a_device_c_which_chooses_the_backend() -> None:
    import pyopencl.array as cla

    from tilegemm.backends.opencl import OpenCLBackend

    a = np.ones((4, 4), np.float32)
    c = cla.to_device(OpenCLBackend().own_device().queue, a)
    assert tilegemm.plan(a, a).backend == "cpu"
    assert tilegemm.plan(a, a, c).backend == "opencl"


# --- PYOPENCL_CTX ------------------------------------------------------------------------------

PYOPENCL_CTX_SCRIPT = """
import json, numpy as np, tilegemm
from tilegemm.backends import get_backend
status = get_backend("opencl").status()
a = np.ones((3, 3), np.float32)
try:
    tilegemm.matmul(a, a, backend="opencl")
    error = ""
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"usable": status.usable, "reason": status.reason, "error": error,
                  "with_device": float(tilegemm.matmul(a, a, backend="opencl",
                                                       device=0)[0, 0])}))
"""


@needs_opencl
def test_a_pyopencl_ctx_that_names_no_device_is_named_and_device_still_works() -> None:
    got = script_json(PYOPENCL_CTX_SCRIPT, env=dict(os.environ, PYOPENCL_CTX="97"))
    assert got["usable"] and got["with_device"] == 3.0
    assert got["error"].startswith(f"{UnavailableError.__name__}: PYOPENCL_CTX='97' names "
                                   "no OpenCL device here")
    assert "pass device=" in got["error"] and "PYOPENCL_CTX='97'" in got["reason"]


@pytest.mark.cudasim
def test_a_float32_device_c_with_16_bit_operands_on_tensor_cores() -> None:
    """float16 operands with dtype=float32 write float32 sums on tensor cores, so a float32
    device c is the result's dtype (it was refused, compared with the operands' float16)."""
    from numba import cuda

    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (4, 16)).astype(np.float16)
    b = rng.uniform(-1, 1, (16, 8)).astype(np.float16)
    c = rng.uniform(-1, 1, (4, 8)).astype(np.float32)
    got = tilegemm.gemm(cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), beta=1.0,
                        dtype=np.float32, backend="cuda")
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidTypeError, match="device c has dtype float64, the result is "
                                               "float32"):
        tilegemm.gemm(cuda.to_device(a), cuda.to_device(b), cuda.to_device(c.astype(np.float64)),
                      beta=1.0, dtype=np.float32, backend="cuda")


def test_a_zero_dimensional_array_is_a_scalar_alpha_or_beta():
    """alpha=np.array(2.0) (what NumPy's reductions give) was refused as 'not a real
    number'; a 1-element 1-D array and NumPy booleans still are."""
    a = np.arange(1.0, 10.0, dtype=np.float32).reshape(3, 3)
    c = np.ones((3, 3), np.float32)
    got = tilegemm.gemm(a, a, c, alpha=np.array(2.0), beta=np.float32(0.5))
    np.testing.assert_allclose(got, 2 * (a.astype(np.float64) @ a) + 0.5, rtol=1e-6)
    for bad in (np.array([2.0]), np.True_):
        with pytest.raises(TypeError, match="alpha must be a real number"):
            tilegemm.gemm(a, a, alpha=bad)
    # a time span is a NumPy number too: it reached float() and raised a bare TypeError
    for name in ("alpha", "beta"):
        with pytest.raises(InvalidTypeError, match=f"{name} must be a real number"):
            tilegemm.gemm(a, a, c, backend="cpu", **{name: np.timedelta64(2, "s")})


@pytest.mark.parametrize("dtype, kind", [([("x", "f8"), ("y", "f8")], "structured"),
                                         ("U3", "strings"), ("M8[s]", "dates"),
                                         ("m8[s]", "time spans")])
def test_types_with_no_product_are_named_as_such(dtype, kind):
    """A structured array was refused as 'the result dtype would be void128'."""
    x = np.zeros((3, 3), dtype)
    with pytest.raises(TypeError, match=f"{kind}.*has no matrix product"):
        tilegemm.matmul(x, x)
    with pytest.raises(TypeError):
        np.matmul(x, x)  # NumPy refuses them too


@pytest.mark.parametrize("backend", HOST)
def test_a_bool_products_alpha_and_beta_take_numpys_int64_range(backend: str) -> None:
    """They scale the bool product in int64 on the host, as NumPy's
    (alpha * (a @ b) + beta * c) != 0 does: beta = 2**31 was refused as 'does not fit in
    bool' (the int32 range of the kernel's counts, which never sees them)."""
    a, c = np.ones((2, 3), bool), np.array([[True, False]])
    b = np.array([[True, False], [False, False], [True, False]])  # a @ b: [[T, F], [T, F]]
    for alpha, beta in ((1, 2**31), (-2**40, 2**62), (0, -2**63)):
        got = tilegemm.gemm(a, b, c, alpha=alpha, beta=beta, backend=backend)
        want = np.int64(alpha) * np.matmul(a, b) + np.int64(beta) * c != 0
        assert got.dtype == bool and (got == want).all(), (alpha, beta)
    with pytest.raises(InvalidValueError, match=r"beta=9223372036854775808 does not fit in "
                                                r"int64, in which a bool product is scaled"):
        tilegemm.gemm(a, b, c, beta=2**63, backend=backend)


@pytest.mark.cudasim
def test_int64_device_arrays_of_either_c_type_are_multiplied() -> None:
    """numba device arrays of np.longlong ('q', int64 on Linux) were refused: "the result
    dtype int64 is computed as int64 and cast back on the host only" (another C type of
    the same int64 counted as a conversion)."""
    from numba import cuda

    a = np.arange(35).reshape(5, 7)
    b = np.arange(21).reshape(7, 3)
    want = a.astype(np.int64) @ b.astype(np.int64)
    for char in ("q", "l"):
        got = tilegemm.matmul(cuda.to_device(a.astype(char)), cuda.to_device(b.astype(char)),
                              backend="cuda", kernel="shared", TILE=8)
        host = got.copy_to_host()
        assert host.dtype == np.int64 and np.array_equal(host, want), char


@pytest.mark.cudasim
@pytest.mark.simulator
def test_overflow_in_a_simulated_kernel_warns_of_nothing() -> None:
    """On the GPU a kernel's overflow is silent (inf); the simulator warned once per GPU
    thread ("overflow encountered in scalar multiply", 64 warnings naming the kernel)."""
    import warnings

    from numba import cuda

    a = np.full((4, 4), 1e30, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = tilegemm.matmul(cuda.to_device(a), cuda.to_device(a), backend="cuda",
                              kernel="shared", TILE=8).copy_to_host()
    assert np.isinf(got).all()


@pytest.mark.cudasim
def test_plan_refuses_device_operands_that_matmul_cannot_view() -> None:
    """Fortran-ordered (2, 3, 4, 5) numba arrays cannot be viewed as a batch of 6 without
    a copy: matmul refused them, but plan returned a Plan (it promises to raise what
    matmul raises); the check now runs before the decision is made."""
    from numba import cuda

    rng = np.random.default_rng()
    a = np.asfortranarray(rng.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32))
    b = np.asfortranarray(rng.uniform(-1, 1, (2, 3, 5, 2)).astype(np.float32))
    for call in (tilegemm.plan, tilegemm.matmul):
        with pytest.raises(InvalidValueError, match=r"cannot be viewed as \(6, 4, 5\)"):
            call(cuda.to_device(a), cuda.to_device(b), backend="cuda", kernel="shared",
                 TILE=8)
    # C-ordered, or a batch that views without a copy: planned and computed
    c = np.ascontiguousarray(a)
    assert tilegemm.plan(cuda.to_device(c), cuda.to_device(np.ascontiguousarray(b)),
                         backend="cuda", kernel="shared", TILE=8).kernel == "shared"


@pytest.mark.cudasim
def test_a_stream_handle_may_be_a_numpy_integer() -> None:
    """stream=np.int64(0) was refused as not a stream, where device=np.int64(0) is taken;
    a NumPy bool still is refused."""
    from numba import cuda

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = tilegemm.matmul(cuda.to_device(a), cuda.to_device(a.T.copy()), backend="cuda",
                          kernel="shared", TILE=8, stream=np.int64(0))
    np.testing.assert_allclose(got.copy_to_host(), a @ a.T, rtol=1e-6)
    with pytest.raises(TypeError, match="stream= must be"):
        tilegemm.matmul(cuda.to_device(a), cuda.to_device(a.T.copy()), backend="cuda",
                        stream=np.True_)
