import numpy as np
import pytest

import parallax as px
import parallax.numpy as pnp
from parallax._core import _testing


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def test_jit_and_value_and_grad_equal_the_cpp_program_bitwise(rng):
    x, w = _f32(rng, 4, 8), _f32(rng, 8, 2)
    text, ref = _testing.reference("tanh_matmul", [px.asarray(x), px.asarray(w)])

    def loss(x, w):
        return pnp.sum(pnp.tanh(x @ w)) * 2.0

    @px.jit
    def step(x, w):
        value, (dx, dw) = px.value_and_grad(loss, argnums=(0, 1))(x, w)
        return value, dx, dw

    out = step(x, w)
    assert str(step.lower(x, w)) == text  # the very same graph
    for got, want in zip(out, ref):
        _same_bits(got, want)
    # eager transforms (a private jit each) agree too
    _same_bits(px.grad(loss, argnums=1)(x, w), ref[2])
    _same_bits(px.jit(loss)(x, w), ref[0])


def test_grad_of_a_loss_with_integer_labels_matches_cpp(rng):
    x, w, b = _f32(rng, 6, 5), _f32(rng, 5, 7), _f32(rng, 7)
    labels = rng.integers(0, 7, size=6).astype(np.int32)
    text, ref = _testing.reference("gelu_ce", [px.asarray(v) for v in (x, w, b, labels)])

    def fn(x, w, b, labels):
        def loss(w, b):
            return px.nn.cross_entropy_loss(px.nn.gelu(x @ w + b), labels)

        value, grads = px.value_and_grad(loss, argnums=(0, 1))(w, b)
        return value, *grads

    f = px.jit(fn, check_indices=False)  # the very ops of the C++ function
    out = f(x, w, b, labels)
    assert str(f.lower(x, w, b, labels)) == text
    for got, want in zip(out, ref):
        _same_bits(got, want)
    # The label check (docs/python.md, "Edges") adds one output, and the same bits.
    checked = px.jit(fn)
    assert str(checked.lower(x, w, b, labels)) != text
    for got, want in zip(checked(x, w, b, labels), ref):
        _same_bits(got, want)


def test_vjp_of_attention_matches_cpp(rng):
    q, k, v = _f32(rng, 1, 2, 4, 8), _f32(rng, 1, 2, 4, 8), _f32(rng, 1, 2, 4, 8)
    _, ref = _testing.reference("attention", [px.asarray(a) for a in (q, k, v)])

    def f(q):
        return pnp.sum(px.nn.dot_product_attention(q, k, v) * v)

    y, back = px.vjp(f, q)
    (dq,) = back(np.ones((), np.float32))
    _same_bits(y, ref[0])
    _same_bits(dq, ref[1])


def test_new_signature_retraces_and_cache_size_shows_it(rng):
    f = px.jit(lambda x: pnp.exp(x) + 1.0)
    f(_f32(rng, 3))
    f(_f32(rng, 3))
    assert f.cache_size() == 1 and f.trace_count == 1
    f(_f32(rng, 4))
    assert f.cache_size() == 2 and f.trace_count == 2
    f(np.ones(3, np.int32).astype(np.float16))
    assert f.cache_size() == 3


def test_max_traces_makes_a_new_signature_an_error(rng):
    f = px.jit(lambda x: x * 2.0, max_traces=1)
    f(_f32(rng, 3))
    with pytest.raises(px.UserError, match=r"new input signature \(f32\[5\]\).*traced for: \(f32\[3\]\)"):
        f(_f32(rng, 5))


def test_wrong_shapes_and_dtypes_name_the_op():
    f = px.jit(lambda x, w: x @ w)
    with pytest.raises(px.Error, match=r"\[matmul\]"):
        f(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
    g = px.jit(lambda a, b: a + b)
    with pytest.raises(px.Error, match=r"\[add\]"):
        g(np.ones(3, np.float32), np.ones(3, np.int32))


def test_pytrees_in_and_out(rng):
    params = {"w": _f32(rng, 3, 2), "b": np.zeros(2, np.float32)}

    @px.jit
    def f(p, xs):
        y = xs[0] @ p["w"] + p["b"]
        return {"y": y, "sum": pnp.sum(y)}

    out = f(params, [np.ones((4, 3), np.float32)])
    assert set(out) == {"y", "sum"} and out["y"].shape == (4, 2)
    g = px.grad(lambda p, x: pnp.sum(x @ p["w"] + p["b"]))(params, np.ones((4, 3), np.float32))
    np.testing.assert_allclose(np.asarray(g["b"]), [4.0, 4.0])
    np.testing.assert_allclose(np.asarray(g["w"]), np.full((3, 2), 4.0))


def test_numpy_names(rng):
    x = _f32(rng, 2, 3, 4)
    y = _f32(rng, 2, 4, 5)

    @px.jit
    def f(x, y):
        return (pnp.einsum("bij,bjk->bik", x, y), pnp.einsum("bij->ji", x), pnp.transpose(x, (2, 0, 1)),
                pnp.reshape(x, (6, 4)), pnp.mean(x, axis=-1), pnp.max(x, axis=(0, 1)), pnp.softmax(x),
                pnp.where(x > 0.0, x, 0.0), x[1, :, 1:3], x.T, pnp.take(np.arange(12, dtype=np.float32),
                                                                        np.array([3, 1], np.int32)),
                pnp.log(pnp.abs(x) + 1.0), pnp.concatenate([x, x], axis=1), pnp.min(x))

    (es, es1, tr, rs, mn, mx, sm, wh, sl, tt, tk, lg, cc, mi) = [np.asarray(a) for a in f(x, y)]
    np.testing.assert_allclose(es, np.einsum("bij,bjk->bik", x, y), rtol=1e-5)
    np.testing.assert_allclose(es1, np.einsum("bij->ji", x), rtol=1e-5)
    np.testing.assert_array_equal(tr, np.transpose(x, (2, 0, 1)))
    np.testing.assert_array_equal(rs, x.reshape(6, 4))
    np.testing.assert_allclose(mn, x.mean(-1), rtol=1e-5)
    np.testing.assert_array_equal(mx, x.max((0, 1)))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(wh, np.where(x > 0, x, 0))
    np.testing.assert_array_equal(sl, x[1, :, 1:3])
    np.testing.assert_array_equal(tt, x.T)
    np.testing.assert_array_equal(tk, [3.0, 1.0])
    np.testing.assert_allclose(lg, np.log(np.abs(x) + 1), rtol=1e-6)
    np.testing.assert_array_equal(cc, np.concatenate([x, x], 1))
    np.testing.assert_array_equal(mi, x.min())


def test_indexing_with_none_and_ellipsis(rng):
    x = _f32(rng, 2, 3, 4)
    a, b = px.jit(lambda x: (x[None, ..., 1], x[:, ::2]))(x)
    np.testing.assert_array_equal(np.asarray(a), x[None, ..., 1])
    np.testing.assert_array_equal(np.asarray(b), x[:, ::2])


def test_tensors_have_no_truth_value():
    with pytest.raises(px.UserError, match="truth value"):
        px.jit(lambda x: x if x > 0.0 else -x)(np.ones(2, np.float32))


def test_jit_runs_on_px_arrays_without_copies(rng):
    x = px.asarray(_f32(rng, 3))
    out = px.jit(lambda x: x)(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


def test_random_numbers_and_stop_gradient():
    @px.jit
    def f(x):
        k = px.random.fold_in(px.random.key(0), 3)
        noise = px.random.normal(k, (2, 3))
        u = px.random.uniform(k, (1000,), minval=2.0, maxval=3.0)
        g = px.grad(lambda x: pnp.sum(x * px.stop_gradient(x)))(x)
        return noise, u, g

    noise, u, g = [np.asarray(a) for a in f(np.full((2, 3), 2.0, np.float32))]
    assert noise.shape == (2, 3) and np.all(noise != 0)
    assert 2.0 <= u.min() and u.max() < 3.0 and abs(u.mean() - 2.5) < 0.05
    np.testing.assert_array_equal(g, np.full((2, 3), 2.0))  # d(x * sg(x))/dx = sg(x)
    again = np.asarray(f(np.zeros((2, 3), np.float32))[0])
    np.testing.assert_array_equal(noise, again)  # the same key, the same numbers


def test_16_bit_and_integer_inputs(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _f32(rng, 4, 8)
    w = _f32(rng, 8, 3)
    f = px.jit(lambda a, b: a @ b)
    for np_dt, px_dt in [(ml_dtypes.bfloat16, px.bf16), (np.float16, px.float16)]:
        out = f(x.astype(np_dt), w.astype(np_dt))
        assert out.dtype == px_dt
        want = x.astype(np_dt).astype(np.float32) @ w.astype(np_dt).astype(np.float32)
        np.testing.assert_allclose(np.asarray(out).astype(np.float32), want, rtol=2e-2, atol=2e-2)
    counts = px.jit(lambda t: pnp.sum(pnp.astype(t > 2, px.int32)))(np.arange(6, dtype=np.int32))
    assert counts.dtype == px.int32 and int(counts) == 3
