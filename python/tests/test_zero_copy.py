"""Arrays into Parallax without a copy: a px.Array adopts the memory of a contiguous NumPy array or
DLPack tensor (same data pointer, writes show on both sides), holds it alive as long as it lives,
never writes into a read-only one, and copies where the layout does not allow sharing."""

import gc
import sys

import numpy as np
import pytest

import parallax as px
import parallax.numpy as pnp

ml_dtypes = pytest.importorskip("ml_dtypes")


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("np_dtype,px_dtype", [(np.float32, px.float32), (ml_dtypes.bfloat16, px.bf16),
                                               (np.float16, px.float16), (np.int32, px.int32),
                                               (np.bool_, px.bool_)])
def test_numpy_round_trip_is_zero_copy(np_dtype, px_dtype):
    x = (np.arange(12) % 3).astype(np_dtype).reshape(3, 4)
    a = px.asarray(x)
    assert a.dtype == px_dtype and a.shape == (3, 4)
    assert a.data_ptr == _ptr(x) and a.adopted and not a.read_only
    back = np.asarray(a)
    assert _ptr(back) == _ptr(x) and back.dtype == x.dtype
    x[2, 3] = 1  # one memory: a write on the NumPy side shows in px and back
    assert np.asarray(a)[2, 3] == 1
    assert px.Array(x).data_ptr == _ptr(x)  # the constructor is asarray
    assert px.from_dlpack(x).data_ptr == _ptr(x)


def test_the_px_array_keeps_the_numpy_array_alive_until_its_last_user_is_gone():
    x = np.arange(1000, dtype=np.float32)
    refs = sys.getrefcount(x)
    a = px.asarray(x)
    b = a.reshape([10, 100])  # shares the buffer and the owner
    assert sys.getrefcount(x) > refs
    with pytest.raises(ValueError, match="referenced"):  # NumPy will not resize memory that is lent out
        x.resize(2000)
    del a
    gc.collect()
    assert sys.getrefcount(x) > refs
    del x
    gc.collect()
    np.testing.assert_array_equal(np.asarray(b).ravel(), np.arange(1000, dtype=np.float32))
    y = np.ones(8, np.float32)
    refs = sys.getrefcount(y)
    c = px.asarray(y)
    del c
    gc.collect()
    assert sys.getrefcount(y) == refs  # released


def test_misaligned_numpy_memory_is_copied_and_copy_false_says_why():
    raw = np.zeros(4 * 8 + 1, np.uint8)
    x = np.frombuffer(raw.data, np.float32, count=8, offset=1)  # one byte off a float boundary
    assert not x.flags.aligned
    a = px.asarray(x)
    assert a.data_ptr != _ptr(x) and not a.adopted
    np.testing.assert_array_equal(np.asarray(a), x)
    with pytest.raises(px.UserError, match="not aligned to its 4-byte elements"):
        px.asarray(x, copy=False)


def test_copy_true_copies_and_copy_false_never_does():
    x = np.arange(6, dtype=np.float32)
    a = px.asarray(x, copy=True)
    assert a.data_ptr != _ptr(x) and not a.adopted
    assert px.asarray(x, copy=False).data_ptr == _ptr(x)
    with pytest.raises(px.UserError, match="copy=False"):
        px.asarray(x, dtype=px.bf16, copy=False)
    with pytest.raises(px.UserError, match="copy=False"):
        px.asarray([1.0, 2.0], copy=False)


def test_non_contiguous_numpy_is_still_an_error():
    with pytest.raises(px.UserError, match="not C-contiguous"):
        px.asarray(np.ones((4, 4), np.float32)[:, ::2])


def test_a_read_only_numpy_array_is_adopted_read_only():
    x = np.arange(6, dtype=np.float32)
    x.flags.writeable = False
    a = px.asarray(x)
    assert a.data_ptr == _ptr(x) and a.read_only
    n = np.asarray(a)
    assert _ptr(n) == _ptr(x) and not n.flags.writeable
    assert memoryview(a).readonly
    with pytest.raises(ValueError):
        n[0] = 1
    # DLPack cannot say read-only: a consumer gets a copy, or an error when it asks for no copy.
    assert np.from_dlpack(a).__array_interface__["data"][0] != _ptr(x)
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__(copy=False)
    assert px.from_dlpack(x).read_only  # NumPy itself refuses a read-only DLPack export
    np.testing.assert_array_equal(np.asarray(a.copy()), x)
    assert not a.copy().read_only


def test_torch_tensors_pass_both_ways_without_a_copy():
    torch = pytest.importorskip("torch")
    for t_dtype, px_dtype in [(torch.float32, px.float32), (torch.bfloat16, px.bf16), (torch.float16, px.float16),
                              (torch.int32, px.int32), (torch.bool, px.bool_)]:
        t = (torch.arange(12) % 2).to(t_dtype).reshape(3, 4)
        a = px.from_dlpack(t)
        assert a.dtype == px_dtype and a.shape == (3, 4)
        assert a.data_ptr == t.data_ptr() and a.adopted
        assert px.asarray(t).data_ptr == t.data_ptr()
        back = torch.from_dlpack(a)  # and out again: the tensor's own memory
        assert back.data_ptr() == t.data_ptr() and back.dtype == t_dtype
    t = torch.zeros(5)
    a = px.from_dlpack(t)
    t[3] = 7.0  # one memory
    assert np.asarray(a)[3] == 7.0
    del t
    gc.collect()
    assert np.asarray(a)[3] == 7.0  # the px.Array holds the tensor
    with pytest.raises(px.Error, match="not contiguous"):
        px.from_dlpack(torch.zeros(3, 4).T)


def test_jit_reads_adopted_inputs_and_writes_fresh_outputs():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    x.flags.writeable = False
    f = px.jit(lambda x: x * 2.0 + 1.0)
    out = f(x)
    np.testing.assert_array_equal(np.asarray(out), x * 2 + 1)
    assert out.data_ptr != _ptr(x)
    np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32).reshape(2, 3))


class _Mlp(px.nn.Module):
    def __init__(self, w1, w2):
        self.w1, self.w2 = w1, w2

    def __call__(self, x):
        return pnp.tanh(x @ self.w1) @ self.w2


@pytest.mark.parametrize("writeable", [False, True])
def test_a_train_step_never_writes_into_adopted_params(writeable, rng):
    w1 = rng.standard_normal((4, 8)).astype(np.float32)
    w2 = rng.standard_normal((8, 4)).astype(np.float32)
    for w in (w1, w2):
        w.flags.writeable = writeable
    before = (w1.copy(), w2.copy())
    x = rng.standard_normal((6, 4)).astype(np.float32)

    def loss(m, x):
        return pnp.mean(pnp.square(m(x) - x))

    opt = px.optim.adamw(1e-2)
    adopted = px.TrainStep(_Mlp(w1, w2), loss, opt, [x])
    own = px.TrainStep(_Mlp(px.asarray(w1, copy=True), px.asarray(w2, copy=True)), loss, opt, [x])
    sa, so = adopted.init([w1, w2]), own.init()  # the params as a list, or the module's
    for _ in range(3):
        la, lo = adopted(sa, x).loss, own(so, x).loss
        assert la == lo  # the same program on the same values: the same bits
    np.testing.assert_array_equal(w1, before[0])  # the step wrote its new params elsewhere
    np.testing.assert_array_equal(w2, before[1])
    np.testing.assert_array_equal(np.asarray(adopted.model(sa).w1), np.asarray(own.model(so).w1))
