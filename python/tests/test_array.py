import numpy as np
import pytest

import parallax as px

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = [(np.float32, px.float32), (ml_dtypes.bfloat16, px.bf16), (np.float16, px.float16),
          (np.int32, px.int32), (np.bool_, px.bool_)]


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("np_dtype,px_dtype", DTYPES)
def test_numpy_round_trip_keeps_values_and_dtype(np_dtype, px_dtype, rng):
    x = (rng.standard_normal((3, 5)) * 4).astype(np_dtype)
    a = px.asarray(x)
    assert a.dtype == px_dtype
    assert a.shape == (3, 5)
    back = np.asarray(a)
    assert back.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("np_dtype,px_dtype", DTYPES)
def test_to_numpy_is_zero_copy(np_dtype, px_dtype):
    a = px.zeros((4, 3), px_dtype)
    n = np.asarray(a)
    assert _ptr(n) == a.data_ptr
    n[1, 2] = 1  # writes through: same memory
    assert np.asarray(a)[1, 2] == 1
    # and back into px: the same buffer again
    assert px.asarray(n).data_ptr == a.data_ptr


def test_numpy_view_outlives_the_px_array():
    a = px.asarray(np.arange(6, dtype=np.float32))
    n = np.asarray(a)
    del a
    np.testing.assert_array_equal(n, np.arange(6, dtype=np.float32))


def test_buffer_protocol_exports_shape_and_format():
    a = px.asarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    m = memoryview(a)
    assert m.format == "i" and m.shape == (2, 3) and m.strides == (12, 4)
    assert m.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("np_dtype,px_dtype", [d for d in DTYPES if d[1] != px.bf16])
def test_dlpack_to_numpy_is_zero_copy(np_dtype, px_dtype):
    a = px.zeros((2, 7), px_dtype)
    n = np.from_dlpack(a)
    assert _ptr(n) == a.data_ptr and n.dtype == np.dtype(np_dtype) and n.shape == (2, 7)
    assert a.__dlpack_device__() == (1, 0)


def test_dlpack_px_round_trip_is_zero_copy():
    a = px.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    b = px.from_dlpack(a)
    assert b.data_ptr == a.data_ptr
    capsule_back = px.Array._from_dlpack_capsule(a.__dlpack__())
    assert capsule_back.data_ptr == a.data_ptr


def test_from_dlpack_of_numpy_copies_the_values():
    x = np.arange(10, dtype=np.int32)
    a = px.from_dlpack(x)
    assert a.dtype == px.int32
    np.testing.assert_array_equal(np.asarray(a), x)


def test_torch_round_trip_is_zero_copy():
    torch = pytest.importorskip("torch")
    for px_dtype, t_dtype in [(px.float32, torch.float32), (px.bf16, torch.bfloat16), (px.int32, torch.int32),
                              (px.float16, torch.float16), (px.bool_, torch.bool)]:
        a = px.zeros((3, 2), px_dtype)
        t = torch.from_dlpack(a)
        assert t.dtype == t_dtype and t.data_ptr() == a.data_ptr and tuple(t.shape) == (3, 2)
        assert px.from_dlpack(t).data_ptr == a.data_ptr
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(px.from_dlpack(t)), t.numpy())
    with pytest.raises(px.Error, match="not contiguous"):
        px.from_dlpack(t.T)


def test_non_contiguous_numpy_is_an_error_naming_the_problem():
    x = np.ones((4, 4), np.float32)[:, ::2]
    with pytest.raises(px.Error, match="not C-contiguous.*np.ascontiguousarray"):
        px.asarray(x)
    with pytest.raises(px.Error, match="not C-contiguous"):
        px.asarray(np.ones((4, 4), ml_dtypes.bfloat16).T)
    assert px.asarray(np.ascontiguousarray(x)).shape == (4, 2)


@pytest.mark.parametrize("bad", [np.float64, np.int64, np.uint8, np.complex64])
def test_unsupported_dtype_is_a_user_error(bad):
    with pytest.raises(px.UserError, match=f"unsupported dtype {np.dtype(bad)}"):
        px.asarray(np.zeros(3, bad))
    with pytest.raises(ValueError):  # a px.UserError is a ValueError
        px.asarray(np.zeros(3, bad))


def test_python_values_default_to_f32_and_i32():
    assert px.asarray([1.5, 2.0]).dtype == px.float32
    assert px.asarray([1, 2]).dtype == px.int32
    assert px.asarray(True).dtype == px.bool_
    assert px.asarray([1, 2], dtype="float32").dtype == px.float32


def test_bf16_values_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 3.0], np.float32)  # the middle one sits between two bf16 values
    a = px.asarray(x).astype(px.bf16)
    np.testing.assert_array_equal(np.asarray(a).astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_cpp_errors_raise_px_error_with_the_cpp_message():
    a = px.asarray(np.zeros((2, 3), np.float32))
    with pytest.raises(px.Error, match=r"reshape"):
        a.reshape([4, 4])
