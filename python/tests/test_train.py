import numpy as np
import pytest

import parallax as px
import parallax.numpy as pnp
from gpt import GPT, Llama, config, loss_fn, python_gpt_like


def _batches(rng, n, vocab=64, shape=(4, 16)):
    out = []
    for _ in range(n):
        t = rng.integers(0, vocab, size=(shape[0], shape[1] + 1)).astype(np.int32)
        out.append((t[:, :-1].copy(), t[:, 1:].copy()))
    return out


def test_module_is_a_pytree_with_param_paths():
    m = python_gpt_like(config())
    paths = list(m.named_parameters())
    assert "blocks.1.attn.wq" in paths and "embed.table" in paths and "final_norm.bias" in paths
    cpp = px.nn.TransformerLm(config())
    assert sorted(paths) == sorted(cpp.store.paths())  # the same params as the C++ model
    leaves, tree = px.tree_flatten(m)
    back = px.tree_unflatten(tree, leaves)
    assert isinstance(back, GPT) and back.blocks[0].attn.n_heads == 2


def test_grad_of_a_module_is_a_module(rng):
    m = px.nn.Linear(3, 2, seed=1)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    g = px.grad(lambda m, x: pnp.sum(m(x)))(m, x)
    assert isinstance(g, px.nn.Linear)
    np.testing.assert_allclose(np.asarray(g.b), [5.0, 5.0])
    np.testing.assert_allclose(np.asarray(g.w), np.repeat(x.sum(0)[:, None], 2, 1), rtol=1e-5)


def test_python_gpt_trains_like_the_cpp_transformer_lm(rng):
    cfg = config()
    cpp_model = px.nn.TransformerLm(cfg)
    weights = dict(zip(cpp_model.store.paths(), cpp_model.init(0)))
    model = python_gpt_like(cfg).load_state_dict(weights)

    opt = px.optim.adamw(3e-3, weight_decay=0.01)
    sample = [(px.int32, (4, 16)), (px.int32, (4, 16))]
    cpp_step = px.TrainStep(cpp_model, None, opt, sample)
    py_step = px.TrainStep(model, loss_fn, opt, sample)
    cpp_state, py_state = cpp_step.init(0), py_step.init()

    losses = []
    for tokens, targets in _batches(rng, 8):
        c = cpp_step(cpp_state, tokens, targets)
        p = py_step(py_state, tokens, targets)
        assert abs(c.loss - p.loss) <= 1e-6, (c, p)
        losses.append(p.loss)
    assert losses[-1] < losses[0]  # it trains
    assert py_state.step == 8
    # The same program: as many kernels and the same planned peak (what the speed bench relies on).
    assert py_step.num_kernels() == cpp_step.num_kernels() > 100
    assert py_step.peak_bytes() == cpp_step.peak_bytes()
    trained = py_step.named_params(py_state)
    for path, arr in zip(cpp_model.store.paths(), cpp_step.gather_params(cpp_state)):
        np.testing.assert_allclose(np.asarray(trained[path]), np.asarray(arr), atol=1e-6)
    assert isinstance(py_step.model(py_state), GPT)


def test_python_llama_trains_like_the_cpp_llama(rng):
    cfg = px.nn.LmConfig.llama("tiny_llama", 64, 32, 4, 2, 2, 48, 16)
    cpp_model = px.nn.TransformerLm(cfg)
    model = Llama(cfg).load_state_dict(dict(zip(cpp_model.store.paths(), cpp_model.init(1))))
    assert sorted(model.named_parameters()) == sorted(cpp_model.store.paths())
    opt = px.optim.adamw(3e-3)
    sample = [(px.int32, (4, 16))] * 2
    cpp_step, py_step = px.TrainStep(cpp_model, None, opt, sample), px.TrainStep(model, loss_fn, opt, sample)
    cpp_state, py_state = cpp_step.init(1), py_step.init()
    for tokens, targets in _batches(rng, 5):
        c, p = cpp_step(cpp_state, tokens, targets), py_step(py_state, tokens, targets)
        assert abs(c.loss - p.loss) <= 1e-6, (c, p)


def test_fused_head_trains_as_the_unfused_head(rng):
    losses = {}
    for fused in (False, True):
        cfg = px.nn.LmConfig.llama("tiny_llama", 64, 32, 4, 2, 2, 48, 16)
        cfg.fused_head = fused
        model = px.nn.TransformerLm(cfg)
        step = px.TrainStep(model, None, px.optim.adamw(3e-3), [(px.int32, (4, 16))] * 2)
        state = step.init(1)
        losses[fused] = [step(state, t, y).loss for t, y in _batches(np.random.default_rng(3), 3)]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)


def test_python_gpt_loss_under_jit_equals_the_train_step_loss(rng):
    model = python_gpt_like(config(), seed=3)
    tokens, targets = _batches(rng, 1)[0]
    step = px.TrainStep(model, loss_fn, px.optim.sgd(0.0), [tokens, targets])
    state = step.init()
    jitted = px.jit(loss_fn)(model, tokens, targets)
    assert step(state, tokens, targets).loss == pytest.approx(float(jitted), abs=1e-6)


def test_train_step_save_load_table_and_peak(tmp_path, rng):
    model = python_gpt_like(config())
    step = px.TrainStep(model, loss_fn, px.optim.adamw(1e-3), [(px.int32, (4, 16))] * 2)
    state = step.init()
    tokens, targets = _batches(rng, 1)[0]
    step(state, tokens, targets)
    # A checkpoint directory (the sharded Zarr format), and the single-file export.
    for path in (tmp_path / "ckpt", tmp_path / "ckpt.safetensors"):
        step.save(path, state)
        assert path.is_dir() == (path.suffix != ".safetensors")
        loaded = step.load(path)
        assert loaded.step == 1
        for a, b in zip(step.gather_params(state), step.gather_params(loaded)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    cfg = config()  # the same model with one block fewer: the checkpoint has tensors it does not
    one_block = GPT(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_layers - 1, cfg.d_ff, cfg.max_seq_len)
    with pytest.raises(px.UserError, match="this model and optimizer do not have: 'blocks.1"):
        px.TrainStep(one_block, loss_fn, px.optim.adamw(1e-3), [(px.int32, (4, 16))] * 2).load(tmp_path / "ckpt")
    assert "blocks.0.attn.wq" in step.table()
    assert step.peak_bytes() > 0
    assert [p.path for p in step.plan().params] == step.paths


def test_bad_batch_and_strategy_are_errors():
    model = px.nn.Linear(3, 2)
    step = px.TrainStep(model, lambda m, x: pnp.sum(m(x)), px.optim.sgd(0.1), [(px.float32, (4, 3))])
    state = step.init()
    with pytest.raises(px.Error):
        step(state, np.ones((4, 5), np.float32))
    with pytest.raises(px.UserError, match="unknown sharding strategy 'ZERO'.*AUTO"):
        px.TrainStep(model, lambda m, x: pnp.sum(m(x)), px.optim.sgd(0.1), [(px.float32, (4, 3))], strategy="ZERO")


def test_optimizers_and_schedules():
    s = px.optim.warmup_cosine(1e-3, 10, 100)
    assert s(5) == pytest.approx(5e-4)
    assert px.optim.adamw(s).lr_at(10) == pytest.approx(1e-3)
    assert px.optim.sgd(0.5, momentum=0.9).name.startswith("sgd")


@pytest.mark.parametrize("options", [{"remat": "full"}, {"remat": "dots_saveable"},
                                     {"offload_params": ["*"], "offload_optimizer_state": True}])
def test_remat_and_offload_change_memory_not_results(options, rng):
    model = python_gpt_like(config(), seed=2)
    sample = [(px.int32, (4, 16))] * 2
    plain = px.TrainStep(model, loss_fn, px.optim.adamw(3e-3), sample)
    other = px.TrainStep(model, loss_fn, px.optim.adamw(3e-3), sample, **options)
    s1, s2 = plain.init(), other.init()
    for tokens, targets in _batches(rng, 3):
        assert plain(s1, tokens, targets).loss == other(s2, tokens, targets).loss  # bitwise
    if "remat" in options:
        assert other.peak_bytes() <= plain.peak_bytes()


def test_microbatches_train_like_the_whole_batch_in_less_memory(rng):
    model = python_gpt_like(config(), seed=2)
    sample = [(px.int32, (8, 16))] * 2
    # eps 1e-5: a gradient that is zero up to rounding (the key biases) moves params by +-lr on the
    # sign of its rounding noise, which the summation order changes; eps bounds that.
    opt = px.optim.adamw(3e-3, eps=1e-5)
    whole = px.TrainStep(model, loss_fn, opt, sample)
    split = px.TrainStep(model, loss_fn, opt, sample, microbatches=4)
    s1, s2 = whole.init(), split.init()
    for tokens, targets in _batches(rng, 3, shape=(8, 16)):
        assert whole(s1, tokens, targets).loss == pytest.approx(split(s2, tokens, targets).loss, rel=1e-5)
    for a, b in zip(whole.gather_params(s1), split.gather_params(s2)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=5e-5)
    assert split.peak_bytes() < whole.peak_bytes()
    with pytest.raises(px.UserError, match="microbatches = 3 does not divide batch array 0"):
        px.TrainStep(model, loss_fn, px.optim.adamw(3e-3), sample, microbatches=3)


def test_offload_model_keeps_the_state_on_the_host_and_the_bits(rng):
    model = python_gpt_like(config(), seed=2)
    sample = [(px.int32, (4, 16))] * 2
    plain = px.TrainStep(model, loss_fn, px.optim.adamw(3e-3), sample)
    off = px.TrainStep(px.offload_model(model), loss_fn, px.optim.adamw(3e-3), sample)
    sharded = px.create_sharded_model(px.offload_model(model, params="blocks.*"), sample, loss_fn=loss_fn,
                                      optimizer=px.optim.adamw(3e-3), strategy="DDP",
                                      mesh=px.Mesh.cpu([("data", 2)]))
    s1, s2, s3 = plain.init(), off.init(), sharded.init()
    for tokens, targets in _batches(rng, 3):
        loss = plain(s1, tokens, targets).loss
        assert off(s2, tokens, targets).loss == loss  # bitwise
        assert sharded(s3, tokens, targets).loss == pytest.approx(loss, rel=1e-5)
    assert off.peak_bytes() < plain.peak_bytes()  # the device's peak; the state is on the host
    with pytest.raises(px.UserError, match="already offloaded"):
        px.offload_model(px.offload_model(model))
    with pytest.raises(px.UserError, match="offload_params"):
        px.TrainStep(px.offload_model(model), loss_fn, px.optim.sgd(0.1), sample, offload_params=["*"])


def test_unknown_remat_policy_names_the_policies():
    with pytest.raises(px.Error, match="everything"):
        px.TrainStep(px.nn.Linear(2, 2), lambda m, x: pnp.sum(m(x)), px.optim.sgd(0.1), [(px.float32, (2, 2))],
                     remat="everything")


def test_remat_of_python_blocks_saves_memory_not_bits(rng):
    class RematGPT(GPT):
        def __call__(self, tokens):
            x = self.embed(tokens) + self.pos_embed.table[: tokens.shape[1]]
            for block in self.blocks:
                x = px.remat(block, "full")(x)
            return self.embed.attend(self.final_norm(x))

    cfg = config()
    plain = python_gpt_like(cfg, seed=4)
    wrapped = RematGPT(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.max_seq_len, seed=4)
    sample = [(px.int32, (4, 16))] * 2
    a = px.TrainStep(plain, loss_fn, px.optim.adamw(3e-3), sample)
    b = px.TrainStep(wrapped, loss_fn, px.optim.adamw(3e-3), sample)
    sa, sb = a.init(), b.init()
    for tokens, targets in _batches(rng, 3):
        assert a(sa, tokens, targets).loss == b(sb, tokens, targets).loss
    assert b.peak_bytes() < a.peak_bytes()

    class RematModelGPT(GPT):
        def __call__(self, tokens):
            x = self.embed(tokens) + self.pos_embed.table[: tokens.shape[1]]
            return self.embed.attend(self.final_norm(px.remat_model(self.blocks, "full")(x)))

    c = px.TrainStep(RematModelGPT(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff,
                                   cfg.max_seq_len, seed=4), loss_fn, px.optim.adamw(3e-3), sample)
    assert c.peak_bytes() == b.peak_bytes()
    with pytest.raises(px.Error, match="auto"):
        px.jit(lambda x: px.remat(lambda y: y * 2.0, "automatic")(x))(np.ones(2, np.float32))


def test_a_pipelined_step_trains_like_one_device_and_counts_its_stages_kernels(rng):
    cfg = config()  # two numbered layers: one per stage
    model = px.nn.TransformerLm(cfg)
    opt = px.optim.adamw(3e-3)
    sample = [(px.int32, (4, 16)), (px.int32, (4, 16))]
    flat = px.TrainStep(model, None, opt, sample, microbatches=2)
    piped = px.TrainStep(model, None, opt, sample, microbatches=2,
                         mesh=px.Mesh.create([("stage", 2)], devices="cpu:2"))
    a, b = flat.init(0), piped.init(0)
    for tokens, targets in _batches(rng, 3):
        fa, fb = flat(a, tokens, targets), piped(b, tokens, targets)
        assert abs(fa.loss - fb.loss) <= 1e-5 * abs(fa.loss), (fa, fb)
    # Every stage's forward, backward and update programs (a step on one device: one program).
    assert piped.num_kernels() > 100 and flat.num_kernels() > 100
