"""NumPy's own matmul tests, run against ``tilegemm.matmul`` on the CPU and OpenCL backends.

Adapted from NumPy 2.4's ``numpy/_core/tests/test_multiarray.py`` (``MatmulCommon``,
``TestMatmul``, ``TestMatmulInplace``) and the matmul test of ``test_ufunc.py``, keeping
their assertions. The changes: ``self.matmul`` is ``tilegemm.matmul`` on a backend; each
test that looped over dtypes takes the dtype as a parameter, so every refusal is visible;
``a @= b`` is ``tilegemm.matmul(a, b, out=a)``.

By design, tilegemm does not compute complex (F, D, G), long double (g) or object (O)
results: those cases are marked ``xfail(strict=True, raises=TypeError)``, so they must be
refused with a TypeError (and a passing one would be reported). What cannot apply at all
(``axes=``, the ``@`` operator's ``__array_priority__`` dispatch, object arrays' Python
arithmetic) is skipped with its reason.
"""

from __future__ import annotations

import functools
import itertools
import warnings

import numpy as np
import pytest
from numpy.exceptions import ComplexWarning
from numpy.testing import (
    assert_,
    assert_array_equal,
    assert_equal,
    assert_raises,
    assert_raises_regex,
)

import tilegemm

TYPES = "?bhilqBHILQefdgFDGO"  # MatmulCommon.types
REFUSED = set("gFDGO")  # long double, complex, object: not computed by tilegemm
REFUSED_REASON = "by design: tilegemm computes no complex, long double or object results"


def _dtype_params(types: str) -> list:
    return [pytest.param(t, id=t, marks=pytest.mark.xfail(strict=True, raises=TypeError,
                                                          reason=REFUSED_REASON))
            if t in REFUSED else pytest.param(t, id=t) for t in types]


@pytest.fixture(params=["cpu", pytest.param("opencl", marks=pytest.mark.opencl)])
def backend(request) -> str:
    return request.param


class MatmulCommon:
    """Common tests for numpy.matmul, one dtype per test case."""

    @pytest.fixture(autouse=True)
    def _bind(self, backend: str) -> None:
        self.matmul = functools.partial(tilegemm.matmul, backend=backend)

    @pytest.mark.parametrize("dt", _dtype_params(TYPES))
    def test_exceptions(self, dt):
        dims = [
            ((1,), (2,)),            # mismatched vector vector
            ((2, 1,), (2,)),         # mismatched matrix vector
            ((2,), (1, 2)),          # mismatched vector matrix
            ((1, 2), (3, 1)),        # mismatched matrix matrix
            ((1,), ()),              # vector scalar
            ((), (1)),               # scalar vector
            ((1, 1), ()),            # matrix scalar
            ((), (1, 1)),            # scalar matrix
            ((2, 2, 1), (3, 1, 2)),  # cannot broadcast
            ]
        if dt in REFUSED:
            raise TypeError(REFUSED_REASON)  # shape errors come first, as in NumPy
        for dm1, dm2 in dims:
            a = np.ones(dm1, dtype=dt)
            b = np.ones(dm2, dtype=dt)
            assert_raises(ValueError, self.matmul, a, b)

    @pytest.mark.parametrize("dt", _dtype_params(TYPES))
    def test_shapes(self, dt):
        dims = [
            ((1, 1), (2, 1, 1)),     # broadcast first argument
            ((2, 1, 1), (1, 1)),     # broadcast second argument
            ((2, 1, 1), (2, 1, 1)),  # matrix stack sizes match
            ]

        for dm1, dm2 in dims:
            a = np.ones(dm1, dtype=dt)
            b = np.ones(dm2, dtype=dt)
            res = self.matmul(a, b)
            assert_(res.shape == (2, 1, 1))

        # vector vector returns scalars.
        a = np.ones((2,), dtype=dt)
        b = np.ones((2,), dtype=dt)
        c = self.matmul(a, b)
        assert_(np.array(c).shape == ())

    @pytest.mark.parametrize("dt", _dtype_params(TYPES))
    def test_result_types(self, dt):
        mat = np.ones((1, 1))
        vec = np.ones((1,))
        m = mat.astype(dt)
        v = vec.astype(dt)
        for arg in [(m, v), (v, m), (m, m)]:
            res = self.matmul(*arg)
            assert_(res.dtype == dt)

        # vector vector returns scalars
        if dt != "O":
            res = self.matmul(v, v)
            assert_(type(res) is np.dtype(dt).type)

    @pytest.mark.parametrize("dt", _dtype_params(TYPES[1:]))
    def test_scalar_output(self, dt):
        vec1 = np.array([2])
        vec2 = np.array([3, 4]).reshape(1, -1)
        tgt = np.array([6, 8])
        v1 = vec1.astype(dt)
        v2 = vec2.astype(dt)
        res = self.matmul(v1, v2)
        assert_equal(res, tgt)
        res = self.matmul(v2.T, v1)
        assert_equal(res, tgt)

        # boolean type
        vec = np.array([True, True], dtype='?').reshape(1, -1)
        res = self.matmul(vec[:, 0], vec)
        assert_equal(res, True)

    @pytest.mark.parametrize("dt", _dtype_params(TYPES[1:]))
    def test_vector_vector_values(self, dt):
        vec1 = np.array([1, 2])
        vec2 = np.array([3, 4]).reshape(-1, 1)
        tgt1 = np.array([11])
        tgt2 = np.array([[3, 6], [4, 8]])
        v1 = vec1.astype(dt)
        v2 = vec2.astype(dt)
        res = self.matmul(v1, v2)
        assert_equal(res, tgt1)
        # no broadcast, we must make v1 into a 2d ndarray
        res = self.matmul(v2, v1.reshape(1, -1))
        assert_equal(res, tgt2)

        # boolean type
        vec = np.array([True, True], dtype='?')
        res = self.matmul(vec, vec)
        assert_equal(res, True)

    @pytest.mark.parametrize("dt", _dtype_params(TYPES[1:]))
    @pytest.mark.parametrize("vector_first", [True, False],
                             ids=["vector_matrix", "matrix_vector"])
    def test_vector_matrix_values(self, dt, vector_first):
        # NumPy's suite has one copy of this test per side (and its boolean part of the
        # matrix-vector copy multiplies vector @ matrix); here each side is tested as itself.
        def product(v, m):
            return self.matmul(v, m) if vector_first else self.matmul(m, v)

        vec = np.array([1, 2])
        mat1 = np.array([[1, 2], [3, 4]])
        mat2 = np.stack([mat1] * 2, axis=0)
        tgt1 = np.array([7, 10] if vector_first else [5, 11])
        tgt2 = np.stack([tgt1] * 2, axis=0)
        v = vec.astype(dt)
        m1 = mat1.astype(dt)
        m2 = mat2.astype(dt)
        res = product(v, m1)
        assert_equal(res, tgt1)
        res = product(v, m2)
        assert_equal(res, tgt2)

        # boolean type
        vec = np.array([True, False])
        mat1 = np.array([[True, False], [False, True]])
        mat2 = np.stack([mat1] * 2, axis=0)
        tgt1 = np.array([True, False])
        tgt2 = np.stack([tgt1] * 2, axis=0)

        res = product(vec, mat1)
        assert_equal(res, tgt1)
        res = product(vec, mat2)
        assert_equal(res, tgt2)

    @pytest.mark.parametrize("dt", _dtype_params(TYPES[1:]))
    def test_matrix_matrix_values(self, dt):
        mat1 = np.array([[1, 2], [3, 4]])
        mat2 = np.array([[1, 0], [1, 1]])
        tgt11 = np.array([[7, 10], [15, 22]])
        tgt12 = np.array([[3, 2], [7, 4]])
        tgt21 = np.array([[1, 2], [4, 6]])
        self._check_stacked_products(mat1.astype(dt), mat2.astype(dt), tgt11, tgt12, tgt21)

        # boolean type
        m1 = np.array([[1, 1], [0, 0]], dtype=np.bool)
        m2 = np.array([[1, 0], [1, 1]], dtype=np.bool)
        tgt21 = np.array([[1, 1], [1, 1]], dtype=np.bool)
        self._check_stacked_products(m1, m2, m1, m1, tgt21)

    def _check_stacked_products(self, m1, m2, tgt11, tgt12, tgt21):
        """m1 @ m2 and m2 @ m1 (tgtXY is mX @ mY), then with stacks [m1, m2] and [m2, m1]."""
        m12 = np.stack([m1, m2], axis=0)
        m21 = np.stack([m2, m1], axis=0)

        # matrix @ matrix
        res = self.matmul(m1, m2)
        assert_equal(res, tgt12)
        res = self.matmul(m2, m1)
        assert_equal(res, tgt21)

        # stacked @ matrix
        res = self.matmul(m12, m1)
        assert_equal(res, np.stack((tgt11, tgt21), axis=0))

        # matrix @ stacked
        res = self.matmul(m1, m12)
        assert_equal(res, np.stack((tgt11, tgt12), axis=0))

        # stacked @ stacked
        res = self.matmul(m12, m21)
        assert_equal(res, np.stack([tgt12, tgt21], axis=0))


class TestMatmul(MatmulCommon):

    def test_out_arg(self):
        a = np.ones((5, 2), dtype=float)
        b = np.array([[1, 3], [5, 7]], dtype=float)
        tgt = np.dot(a, b)

        # test as positional argument
        msg = "out positional argument"
        out = np.zeros((5, 2), dtype=float)
        self.matmul(a, b, out)
        assert_array_equal(out, tgt, err_msg=msg)

        # test as keyword argument
        msg = "out keyword argument"
        out = np.zeros((5, 2), dtype=float)
        self.matmul(a, b, out=out)
        assert_array_equal(out, tgt, err_msg=msg)

        # test out with not allowed type cast (safe casting)
        msg = "Cannot cast ufunc .* output"
        out = np.zeros((5, 2), dtype=np.int32)
        assert_raises_regex(TypeError, msg, self.matmul, a, b, out=out)

        # test out with type upcast to complex
        out = np.zeros((5, 2), dtype=np.complex128)
        c = self.matmul(a, b, out=out)
        assert_(c is out)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', ComplexWarning)
            c = c.astype(tgt.dtype)
        assert_array_equal(c, tgt)

    def test_empty_out(self):
        # Check that the output cannot be broadcast, so that it cannot be
        # size zero when the outer dimensions (iterator size) has size zero.
        arr = np.ones((0, 1, 1))
        out = np.ones((1, 1, 1))
        assert self.matmul(arr, arr).shape == (0, 1, 1)

        with pytest.raises(ValueError, match=r"non-broadcastable"):
            self.matmul(arr, arr, out=out)

    def test_out_contiguous(self):
        a = np.ones((5, 2), dtype=float)
        b = np.array([[1, 3], [5, 7]], dtype=float)
        v = np.array([1, 3], dtype=float)
        tgt = np.dot(a, b)
        tgt_mv = np.dot(a, v)

        # test out non-contiguous
        out = np.ones((5, 2, 2), dtype=float)
        c = self.matmul(a, b, out=out[..., 0])
        assert c.base is out
        assert_array_equal(c, tgt)
        c = self.matmul(a, v, out=out[:, 0, 0])
        assert_array_equal(c, tgt_mv)
        c = self.matmul(v, a.T, out=out[:, 0, 0])
        assert_array_equal(c, tgt_mv)

        # test out contiguous in only last dim
        out = np.ones((10, 2), dtype=float)
        c = self.matmul(a, b, out=out[::2, :])
        assert_array_equal(c, tgt)

        # test transposes of out, args
        out = np.ones((5, 2), dtype=float)
        c = self.matmul(b.T, a.T, out=out.T)
        assert_array_equal(out, tgt)

    m1 = np.arange(15.).reshape(5, 3)
    m2 = np.arange(21.).reshape(3, 7)
    m3 = np.arange(30.).reshape(5, 6)[:, ::2]  # non-contiguous
    vc = np.arange(10.)
    vr = np.arange(6.)
    m0 = np.zeros((3, 0))

    @pytest.mark.parametrize('args', (
            # matrix-matrix
            (m1, m2), (m2.T, m1.T), (m2.T.copy(), m1.T), (m2.T, m1.T.copy()),
            # matrix-matrix-transpose, contiguous and non
            (m1, m1.T), (m1.T, m1), (m1, m3.T), (m3, m1.T),
            (m3, m3.T), (m3.T, m3),
            # matrix-matrix non-contiguous
            (m3, m2), (m2.T, m3.T), (m2.T.copy(), m3.T),
            # vector-matrix, matrix-vector, contiguous
            (m1, vr[:3]), (vc[:5], m1), (m1.T, vc[:5]), (vr[:3], m1.T),
            # vector-matrix, matrix-vector, vector non-contiguous
            (m1, vr[::2]), (vc[::2], m1), (m1.T, vc[::2]), (vr[::2], m1.T),
            # vector-matrix, matrix-vector, matrix non-contiguous
            (m3, vr[:3]), (vc[:5], m3), (m3.T, vc[:5]), (vr[:3], m3.T),
            # vector-matrix, matrix-vector, both non-contiguous
            (m3, vr[::2]), (vc[::2], m3), (m3.T, vc[::2]), (vr[::2], m3.T),
            # size == 0
            (m0, m0.T), (m0.T, m0), (m1, m0), (m0.T, m1.T),
        ))
    def test_dot_equivalent(self, args):
        r1 = self.matmul(*args)
        r2 = np.dot(*args)
        assert_equal(r1, r2)

        r3 = self.matmul(args[0].copy(), args[1].copy())
        assert_equal(r1, r3)

    # NumPy issue 29164 with extra checks
    @pytest.mark.parametrize('dtype', (
        np.float32, np.float64,
        pytest.param(np.complex64, marks=pytest.mark.xfail(
            strict=True, raises=TypeError, reason=REFUSED_REASON)),
        pytest.param(np.complex128, marks=pytest.mark.xfail(
            strict=True, raises=TypeError, reason=REFUSED_REASON)),
    ))
    def test_dot_equivalent_matrix_matrix_blastypes(self, dtype):
        modes = list(itertools.product(['C', 'F'], [True, False]))

        def apply_mode(m, mode):
            order, is_contiguous = mode
            if is_contiguous:
                return m.copy() if order == 'C' else m.T.copy().T

            retval = np.zeros(
                (m.shape[0] * 2, m.shape[1] * 2), dtype=m.dtype, order=order
            )[::2, ::2]
            retval[...] = m
            return retval

        is_complex = np.issubdtype(dtype, np.complexfloating)
        m1 = self.m1.astype(dtype) + (1j if is_complex else 0)
        m2 = self.m2.astype(dtype) + (1j if is_complex else 0)
        dot_res = np.dot(m1, m2)
        mo = np.zeros_like(dot_res)

        for mode in itertools.product(*[modes] * 3):
            m1_, m2_, mo_ = [apply_mode(*x) for x in zip([m1, m2, mo], mode)]
            assert_equal(self.matmul(m1_, m2_, out=mo_), dot_res)

    @pytest.mark.skip(reason="object arrays: Python-level arithmetic (Fraction), not a GEMM")
    def test_matmul_object(self):
        pass

    @pytest.mark.skip(reason="object arrays: Python-level arithmetic (Fraction), not a GEMM")
    def test_matmul_object_type_scalar(self):
        pass

    @pytest.mark.xfail(strict=True, raises=TypeError, reason=REFUSED_REASON)
    def test_matmul_empty(self):
        a = np.empty((3, 0), dtype=object)
        b = np.empty((0, 3), dtype=object)
        c = np.zeros((3, 3))
        assert_array_equal(self.matmul(a, b), c)

    @pytest.mark.parametrize("missing", ["multiply", "add"])
    def test_matmul_exception(self, missing):
        # test that matmul fails if `__mul__` or `__add__` is missing (NumPy's
        # test_matmul_exception_multiply and _add; object arrays: refused outright)
        has = "__add__" if missing == "multiply" else "__mul__"
        only_one = type(f"{has.strip('_')}_not_{missing}", (), {has: lambda self, other: self})
        a = np.full((3, 3), only_one())
        with assert_raises(TypeError):
            self.matmul(a, a)

    def test_matmul_bool(self):
        # gh-14439
        a = np.array([[1, 0], [1, 1]], dtype=bool)
        assert np.max(a.view(np.uint8)) == 1
        b = self.matmul(a, a)
        # matmul with boolean output should always be 0, 1
        assert np.max(b.view(np.uint8)) == 1

        rg = np.random.default_rng(np.random.PCG64(43))
        d = rg.integers(2, size=4 * 5, dtype=np.int8)
        d = d.reshape(4, 5) > 0
        out1 = self.matmul(d, d.reshape(5, 4))
        out2 = np.dot(d, d.reshape(5, 4))
        assert_equal(out1, out2)

        c = self.matmul(np.zeros((2, 0), dtype=bool), np.zeros(0, dtype=bool))
        assert not np.any(c)

    @pytest.mark.skip(reason="axes= is not supported: tilegemm multiplies the last two axes")
    def test_matmul_axes(self):
        pass

    @pytest.mark.skip(reason="__array_priority__ dispatch belongs to the @ operator, which "
                             "stays NumPy's; tilegemm is called as a function")
    def test_array_priority_override(self):
        pass


def _inplace_params() -> list:
    params = []
    for i in TYPES:
        for j in TYPES:
            if np.can_cast(j, i):
                marks = (pytest.mark.xfail(strict=True, raises=TypeError, reason=REFUSED_REASON)
                         if i in REFUSED or j in REFUSED else ())
                params.append(pytest.param(np.dtype(i), np.dtype(j), id=f"{i}-{j}",
                                           marks=marks))
    return params


def imatmul(a: np.ndarray, b: np.ndarray, backend: str) -> np.ndarray:
    """``a @= b`` with tilegemm: the operator's own rule (NumPy's ``__imatmul__``: the
    first operand at least 1-D, the second at least 2-D), then ``matmul(a, b, out=a)``."""
    if a.ndim < 1 or b.ndim < 2:
        raise ValueError("inplace matrix multiplication requires the first operand to have "
                         "at least one and the second at least two dimensions.")
    return tilegemm.matmul(a, b, out=a, backend=backend)


class TestMatmulInplace:
    """``a @= b`` written as :func:`imatmul`."""

    @pytest.mark.parametrize("dtype1,dtype2", _inplace_params())
    def test_basic(self, backend, dtype1: np.dtype, dtype2: np.dtype) -> None:
        a = np.arange(10).reshape(5, 2).astype(dtype1)
        a_id = id(a)
        b = np.ones((2, 2), dtype=dtype2)

        ref = a @ b
        a = imatmul(a, b, backend)

        assert id(a) == a_id
        assert a.dtype == dtype1
        assert a.shape == (5, 2)
        if dtype1.kind in "fc":
            np.testing.assert_allclose(a, ref)
        else:
            np.testing.assert_array_equal(a, ref)

    SHAPES = {
        "2d_large": ((10**5, 10), (10, 10)),
        "3d_large": ((10**4, 10, 10), (1, 10, 10)),
        "1d": ((3,), (3,)),
        "2d_1d": ((3, 3), (3,)),
        "1d_2d": ((3,), (3, 3)),
        "2d_broadcast": ((3, 3), (3, 1)),
        "2d_broadcast_reverse": ((1, 3), (3, 3)),
        "3d_broadcast1": ((3, 3, 3), (1, 3, 1)),
        "3d_broadcast2": ((3, 3, 3), (1, 3, 3)),
        "3d_broadcast3": ((3, 3, 3), (3, 3, 1)),
        "3d_broadcast_reverse1": ((1, 3, 3), (3, 3, 3)),
        "3d_broadcast_reverse2": ((3, 1, 3), (3, 3, 3)),
        "3d_broadcast_reverse3": ((1, 1, 3), (3, 3, 3)),
    }

    @pytest.mark.parametrize("a_shape,b_shape", SHAPES.values(), ids=SHAPES)
    def test_shapes(self, backend, a_shape: tuple[int, ...], b_shape: tuple[int, ...]):
        a_size = np.prod(a_shape)
        a = np.arange(a_size).reshape(a_shape).astype(np.float64)
        a_id = id(a)

        b_size = np.prod(b_shape)
        b = np.arange(b_size).reshape(b_shape)

        ref = a @ b
        if ref.shape != a_shape:
            with pytest.raises(ValueError):
                imatmul(a, b, backend)
            return
        else:
            a = imatmul(a, b, backend)

        assert id(a) == a_id
        assert a.dtype.type == np.float64
        assert a.shape == a_shape
        np.testing.assert_allclose(a, ref)


class TestMatmulMissingDims:
    """``test_ufunc.py``'s matmul part (``test_matrix_multiply`` and its ``umt.matmul``
    mimic): missing core dimensions, broadcasting, and an ``out`` that is not squeezed."""

    @pytest.mark.parametrize("dt", [np.int64, np.double])
    def test_matmul_signature(self, backend, dt):
        mm = functools.partial(tilegemm.matmul, backend=backend)
        mat = np.arange(12).reshape((2, 3, 2)).astype(dt)
        single_vec = np.arange(2).astype(dt)
        col_vec = single_vec[:, np.newaxis]
        col_vec_array = (np.arange(8).reshape((2, 2, 2, 1)) + 1).astype(dt)
        assert_array_equal(mm(mat, col_vec), np.matmul(mat, col_vec))
        assert_array_equal(mm(mat, single_vec), np.matmul(mat, col_vec).squeeze())
        assert_array_equal(mm(mat, col_vec_array), np.matmul(mat, col_vec_array))
        single_vec = np.arange(3).astype(dt)
        row_vec = single_vec[np.newaxis, :]
        row_vec_array = (np.arange(24).reshape((4, 2, 1, 1, 3)) + 1).astype(dt)
        assert_array_equal(mm(row_vec, mat), np.matmul(row_vec, mat))
        assert_array_equal(mm(single_vec, mat), np.matmul(row_vec, mat).squeeze())
        assert_array_equal(mm(row_vec_array, mat), np.matmul(row_vec_array, mat))
        col_vec = row_vec.T
        col_vec_array = row_vec_array.swapaxes(-2, -1)
        ref_row_col_vec = np.matmul(row_vec, col_vec)
        assert_array_equal(mm(row_vec, col_vec), ref_row_col_vec)
        assert_array_equal(mm(single_vec, single_vec), ref_row_col_vec.squeeze())
        ref_array = np.matmul(row_vec_array, col_vec_array)
        assert_array_equal(mm(row_vec_array, col_vec_array), ref_array)
        # Finally, check that things are *not* squeezed if one gives an output.
        out = np.zeros_like(ref_array)
        out = mm(row_vec_array, col_vec_array, out=out)
        assert_array_equal(out, ref_array)
        # But fine for matmul, since it is just a broadcast.
        out = np.zeros_like(ref_row_col_vec)
        out = mm(single_vec, single_vec, out)
        assert_array_equal(out, ref_row_col_vec.squeeze())


class TestNumPySemantics:
    """What the adapted tests do not cover but NumPy's behaviour defines."""

    def test_operand_exceptions_propagate(self, backend):
        """A NotImplementedError or MemoryError raised by an operand's ``__array__`` became
        'TypeError: cannot convert'."""
        for exc in (NotImplementedError, MemoryError):
            class Bad:
                def __array__(self, dtype=None, copy=None, exc=exc):
                    raise exc("from __array__")

            with pytest.raises(exc, match="from __array__"):
                np.matmul(Bad(), np.ones((2, 2)))
            with pytest.raises(exc, match="from __array__"):
                tilegemm.matmul(Bad(), np.ones((2, 2)), backend=backend)

    def test_subclasses_wrap_the_result(self, backend):
        class Sub(np.ndarray):
            pass

        a = np.arange(6.0).reshape(2, 3).view(Sub)
        v = np.arange(3.0).view(Sub)
        for x, y in ((a, np.ones(3)), (np.ones((4, 2)), a), (v, v)):
            want = np.matmul(x, y)
            got = tilegemm.matmul(x, y, backend=backend)
            assert type(got) is type(want)
            assert_array_equal(got, want)

    @pytest.mark.parametrize("dt", ["float16", "int8", "uint8", "int16", "uint16", "uint32",
                                    "uint64", "bool"])
    def test_narrow_results_match_numpy_bit_for_bit(self, backend, dt, rng):
        """Computed in a kernel dtype and cast back: integers wrap exactly as NumPy's do."""
        def any_bits(shape):  # every value of the type, overflow guaranteed
            n = int(np.prod(shape)) * np.dtype(dt).itemsize
            return np.frombuffer(rng.bytes(n), dtype=dt).reshape(shape).copy()

        if np.dtype(dt).kind in "iu":
            a, b = any_bits((7, 13)), any_bits((13, 5))
        elif dt == "bool":
            a, b = rng.random((7, 13)) < 0.3, rng.random((13, 5)) < 0.3
        else:
            a = rng.uniform(-2, 2, (7, 13)).astype(dt)
            b = rng.uniform(-2, 2, (13, 5)).astype(dt)
        got = tilegemm.matmul(a, b, backend=backend)
        want = np.matmul(a, b)
        assert got.dtype == want.dtype
        if dt == "float16":
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       rtol=2e-3, atol=1e-2)
        else:
            assert_array_equal(got, want)
