"""The edge rules of docs/python.md ("Edges"), each checked as a NumPy / JAX user would meet it."""

import numpy as np
import pytest

import parallax as px
import parallax.numpy as pnp

TABLE = np.arange(12, dtype=np.float32).reshape(4, 3)


def test_take_fills_out_of_range_indices_with_nan_by_default():
    idx = np.array([1, -1, 4, -5], np.int32)  # -1 counts from the end; 4 and -5 are out of range
    got = np.asarray(px.jit(lambda t, i: pnp.take(t, i))(TABLE, idx))
    np.testing.assert_array_equal(got[:2], TABLE[[1, -1]])
    assert np.isnan(got[2:]).all()
    ints = px.jit(lambda t, i: pnp.take(t, i))(np.arange(4, dtype=np.int32), np.array([0, 9], np.int32))
    np.testing.assert_array_equal(np.asarray(ints), [0, np.iinfo(np.int32).min])
    filled = px.jit(lambda t, i: pnp.take(t, i, fill_value=-1.0))(TABLE, np.array([7], np.int32))
    np.testing.assert_array_equal(np.asarray(filled), [[-1.0, -1.0, -1.0]])


def test_take_clip_clamps_and_raise_is_an_error_after_the_call():
    idx = np.array([-3, 1, 9], np.int32)
    clipped = px.jit(lambda t, i: pnp.take(t, i, mode="clip"))(TABLE, idx)
    np.testing.assert_array_equal(np.asarray(clipped), TABLE[[0, 1, 3]])
    raising = px.jit(lambda t, i: pnp.take(t, i, mode="raise"))
    np.testing.assert_array_equal(np.asarray(raising(TABLE, np.array([3, -4], np.int32))), TABLE[[3, 0]])
    with pytest.raises(px.UserError, match=r"take\(mode='raise'\): 1 of the indices \(i32\[3\]\) lie outside \[0, 4\)"):
        raising(TABLE, idx)
    with pytest.raises(px.UserError, match="mode='wrap'; expected one of fill, clip, raise"):
        px.jit(lambda t, i: pnp.take(t, i, mode="wrap"))(TABLE, idx)


def test_take_along_other_axes_is_shaped_like_numpy():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[2, 0], [1, 1]], np.int32)
    for axis in (1, 2, -1, None):
        got = px.jit(lambda a, i, axis=axis: pnp.take(a, i, axis=axis))(x, idx)
        np.testing.assert_array_equal(np.asarray(got), np.take(x, idx, axis=axis), err_msg=str(axis))


def test_an_out_of_range_take_has_no_gradient():
    g = px.grad(lambda t: pnp.sum(pnp.take(t, np.array([2, 6, 2], np.int32))))(np.ones(4, np.float32))
    np.testing.assert_array_equal(np.asarray(g), [0, 0, 2, 0])


def test_cross_entropy_labels_outside_the_vocabulary_are_an_error():
    logits = np.zeros((2, 3, 5), np.float32)
    labels = np.array([[0, 4, -100], [1, 2, 3]], np.int32)
    for op in (px.nn.cross_entropy_loss, px.nn.softmax_cross_entropy):
        ok = px.jit(lambda lg, lb, op=op: pnp.sum(op(lg, lb)))(logits, labels)  # -100 is ignored
        assert np.isfinite(np.asarray(ok))
    bad = labels.copy()
    bad[1, 2], bad[0, 0] = 5, -1
    with pytest.raises(px.UserError, match=r"cross_entropy_loss: labels: 2 of the indices \(i32\[2,3\]\) lie outside "
                                           r"\[0, 5\) and are not -100 \(the ignore index\)"):
        px.jit(px.nn.cross_entropy_loss)(logits, bad)
    with pytest.raises(px.UserError, match="softmax_cross_entropy: labels: 2 of the indices"):
        px.grad(lambda lg, lb: pnp.sum(px.nn.softmax_cross_entropy(lg, lb)))(logits, bad)
    emb = px.nn.Embedding(5, 2)
    with pytest.raises(px.UserError, match=r"Embedding: token ids: 1 of the indices .* outside \[0, 5\)"):
        px.jit(lambda m, t: m(t))(emb, np.array([0, 5], np.int32))


def test_reductions_without_an_identity_of_empty_arrays_raise():
    empty = np.zeros((0, 3), np.float32)
    for name in ("max", "min", "argmax", "argmin"):
        with pytest.raises(px.UserError, match=rf"px.numpy.{name}: reduces axis 0 of size 0 \(f32\[0,3\]\)"):
            px.jit(lambda x, name=name: getattr(pnp, name)(x))(empty)
    rows = px.jit(lambda x: (pnp.max(x, axis=1), pnp.sum(x)))(empty)  # nothing empty is reduced
    assert rows[0].shape == (0,) and float(np.asarray(rows[1])) == 0.0


def test_argmax_and_argmin_agree_with_numpy():
    x = np.array([[1, 5, 5, -2], [7, 0, 7, np.nan], [3, 3, 3, 3]], np.float32)
    f = px.jit(lambda x: (pnp.argmax(x, axis=1), pnp.argmin(x, axis=-1), pnp.argmax(x), pnp.argmax(x, 0, True)))
    am, an, flat, keep = [np.asarray(a) for a in f(x)]
    np.testing.assert_array_equal(am, np.argmax(x, axis=1))  # the first maximum; NaN wins
    np.testing.assert_array_equal(an, np.argmin(x, axis=-1))
    assert int(flat) == np.argmax(x) and keep.shape == (1, 4)
    np.testing.assert_array_equal(keep, np.argmax(x, 0, keepdims=True))


def test_python_scalars_returned_from_a_traced_function_are_0d():
    f = px.jit(lambda x: (pnp.sum(x), 2.0, 3, True))
    outs = f(np.ones(3, np.float32))
    assert [o.shape for o in outs] == [(), (), (), ()]
    assert [np.asarray(o).item() for o in outs[1:]] == [2.0, 3, True]
    assert px.asarray(1.5).shape == () and px.asarray([1.5]).shape == (1,)
