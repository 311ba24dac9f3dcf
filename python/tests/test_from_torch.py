"""px.from_torch: PyTorch modules (transformers' GPT-2, Llama, Mistral, Qwen2 and a plain torch
transformer) through torch.export as px.nn.Modules: logits and gradients equal torch's, AdamW
training equals torch's and shards like one device, and what Parallax cannot take is a
px.UserError naming the op and the model's line."""

import sys

import numpy as np
import pytest

import parallax as px
from parallax import nn

torch = pytest.importorskip("torch")
F = torch.nn.functional

VOCAB, BATCH, SEQ = 64, 4, 8


def _hf(name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2, attn_pdrop=0.0,
                                      resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(cfg)
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=16)
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    if name == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**small, sliding_window=None))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small))


class TinyTransformer(torch.nn.Module):
    """A plain torch decoder: nn.TransformerEncoder with a causal mask, learned positions, a head."""

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Parameter(torch.randn(16, d) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, tokens):
        s = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:s]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(s)
        return self.head(self.norm(self.encoder(x, mask=mask, is_causal=True)))


def _convert(model):
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    kwargs = {} if isinstance(model, TinyTransformer) else {"use_cache": False}
    return px.from_torch(model, (tokens,), kwargs)


def _torch_logits(model, tokens):
    out = model(torch.as_tensor(tokens, dtype=torch.long), **({} if isinstance(model, TinyTransformer)
                                                              else {"use_cache": False}))
    return out if isinstance(out, torch.Tensor) else out.logits


def _torch_loss(model, tokens, targets):
    logits = _torch_logits(model, tokens)
    return F.cross_entropy(logits.reshape(-1, VOCAB), torch.as_tensor(targets, dtype=torch.long).reshape(-1))


def loss_fn(model, tokens, targets):
    return nn.cross_entropy_loss(model(tokens), targets)


def _batch(rng):
    t = rng.integers(0, VOCAB, size=(BATCH, SEQ + 1)).astype(np.int32)
    return t[:, :-1].copy(), t[:, 1:].copy()


def _close(a, b, rel, what):
    scale = max(float(np.abs(b).max()), 1e-30)
    err = float(np.abs(np.asarray(a) - np.asarray(b)).max()) / scale
    assert err <= rel, f"{what}: max |diff| / max |torch| = {err:.3g} > {rel}"


MODELS = ["gpt2", "llama", "mistral", "qwen2", "torch_transformer"]


def _model(name):
    return TinyTransformer() if name == "torch_transformer" else _hf(name)


@pytest.mark.parametrize("name", MODELS)
def test_logits_and_gradients_equal_torch(name, rng):
    model = _model(name)
    pm = _convert(model)
    tokens, targets = _batch(rng)
    _close(pm(tokens), _torch_logits(model, tokens).detach().numpy(), 1e-5, f"{name} logits")

    grads = px.grad(loss_fn)(pm, tokens, targets).named_parameters()
    model.zero_grad()
    _torch_loss(model, tokens, targets).backward()
    torch_params = dict(model.named_parameters())
    assert set(grads) == set(torch_params)  # tied weights (GPT-2's head) are one param, as in torch
    for path, g in grads.items():
        _close(g, torch_params[path].grad.numpy(), 1e-5, f"{name} d loss / d {path}")


def test_params_share_the_torch_tensors_memory_and_ops_fuse():
    model = _hf("gpt2")
    pm = _convert(model)
    params = pm.named_parameters()
    assert "lm_head.weight" not in params  # tied to transformer.wte.weight
    for path, p in model.named_parameters():
        assert params[path].data_ptr == p.data_ptr(), path
    assert pm.input_names == ["input_ids"]
    # HF's causal mask (built by torch, a constant) becomes Parallax's fused causal attention
    graph = str(pm.graph)
    assert graph.count("= attention[causal=1 key_padding=0") == 2
    # gelu_new's decomposition (tanh form) is one fused gelu again, and no op of it is left
    assert graph.count('= gelu[approximate="tanh"]') == 2 and "tanh" not in graph.replace('"tanh"', "")
    assert "silu" in str(_convert(_hf("llama")).graph)  # x * sigmoid(x): fused silu


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral", "qwen2"])
def test_adamw_auto_on_cpu4_equals_one_device_and_torch(name, rng):
    model = _model(name)
    pm = _convert(model)
    lr, wd = 3e-3, 0.01
    opt = px.optim.adamw(lr, weight_decay=wd)
    sample = [(px.int32, (BATCH, SEQ))] * 2
    one = px.TrainStep(pm, loss_fn, opt, sample)
    auto = px.create_sharded_model(pm, sample, loss_fn=loss_fn, optimizer=opt, strategy="AUTO",
                                   mesh=px.Mesh.cpu([("data", 2), ("model", 2)]), auto_time_limit_s=2)
    assert auto.devices == 4
    torch_opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    s1, s4 = one.init(), auto.init()
    for step in range(20):
        tokens, targets = _batch(rng)
        a, b = one(s1, tokens, targets), auto(s4, tokens, targets)
        torch_opt.zero_grad()
        loss = _torch_loss(model, tokens, targets)
        loss.backward()
        torch_opt.step()
        assert abs(a.loss - b.loss) <= 1e-6 * max(1.0, abs(a.loss)), (step, a.loss, b.loss)
        assert abs(a.loss - loss.item()) <= 1e-4 * max(1.0, abs(loss.item())), (step, a.loss, loss.item())
    torch_params = dict(model.named_parameters())
    for path, x, y in zip(one.paths, one.gather_params(s1), auto.gather_params(s4)):
        x, y, t = (_without_key_bias(path, np.asarray(a)) for a in (x, y, torch_params[path].detach().numpy()))
        np.testing.assert_allclose(x, y, atol=1e-5, err_msg=path)  # losses: 1e-6 (above), as test_sharding
        np.testing.assert_allclose(x, t, atol=1e-4, err_msg=path)


def _without_key_bias(path, a):
    """The key biases' true gradient is zero (softmax ignores a shift along the keys): what they get
    is rounding noise, which Adam scales up to lr-sized steps, differently per program."""
    if path.endswith("k_proj.bias"):
        return a[:0]
    if path.endswith("c_attn.bias"):  # GPT-2's fused q, k, v bias
        d = a.shape[0] // 3
        return np.concatenate([a[:d], a[2 * d:]])
    return a


@pytest.mark.parametrize("strategy", ["DDP", "FSDP", "TP"])
def test_recipes_train_a_converted_gpt2_like_one_device(strategy, rng):
    pm = _convert(_hf("gpt2"))
    opt = px.optim.adamw(3e-3)
    sample = [(px.int32, (BATCH, SEQ))] * 2
    one = px.TrainStep(pm, loss_fn, opt, sample)
    sharded = px.create_sharded_model(pm, sample, loss_fn=loss_fn, optimizer=opt, strategy=strategy,
                                      mesh=px.Mesh.cpu([("data", 2), ("model", 2)]))
    assert sharded.plan().strategy == px.strategy(strategy)
    s1, s4 = one.init(), sharded.init()
    for _ in range(3):
        tokens, targets = _batch(rng)
        a, b = one(s1, tokens, targets), sharded(s4, tokens, targets)
        assert abs(a.loss - b.loss) <= 1e-6 * max(1.0, abs(a.loss)), (strategy, a.loss, b.loss)


class _MaskedAttention(torch.nn.Module):
    """Attention under a mask that is neither causal nor key padding (the written-out path)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.qkv = torch.nn.Linear(16, 48)
        self.register_buffer("mask", torch.rand(SEQ, SEQ) > 0.3, persistent=False)
        self.mask[:, 0] = True

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], SEQ, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask).sum(1)


def test_arbitrary_attention_masks_match_torch(rng):
    model = _MaskedAttention()
    x = rng.standard_normal((2, SEQ, 16)).astype(np.float32)
    pm = px.from_torch(model, (torch.from_numpy(x),))
    _close(pm(x), model(torch.from_numpy(x)).detach().numpy(), 1e-5, "masked attention")


class _Gather(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.w = torch.nn.Parameter(torch.randn(5, 10, 3))

    def forward(self, idx):
        return self.w[:, idx].sum(-1)  # index.Tensor on dim 1 with an input index tensor


def test_indexing_by_an_input_matches_torch():
    model = _Gather()
    idx = np.array([[9, 0], [-1, 4]], np.int32)
    pm = px.from_torch(model, (torch.from_numpy(idx).long(),))
    want = model(torch.from_numpy(idx).long())
    _close(pm(idx), want.detach().numpy(), 1e-6, "w[:, idx]")
    want.pow(2).sum().backward()
    grad = px.grad(lambda m, i: px.numpy.sum(px.numpy.square(m(i))))(pm, idx).named_parameters()["w"]
    _close(grad, model.w.grad.numpy(), 1e-6, "d/dw")


class _Cumsum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return (x * self.w).cumsum(-1)  # no Parallax op for a running sum of a traced value


def test_an_unsupported_op_names_the_op_and_the_line():
    with pytest.raises(px.UserError, match=r"aten\.cumsum\.default") as info:
        px.from_torch(_Cumsum(), (torch.ones(2, 4),))
    assert "test_from_torch.py" in str(info.value) and "cumsum(-1)" in str(info.value)


def test_bad_inputs_are_user_errors(monkeypatch):
    pm = _convert(_hf("gpt2"))
    with pytest.raises(px.UserError, match=r"exported for i32\[4,8\]"):
        pm(np.zeros((2, 8), np.int32))
    with pytest.raises(px.UserError, match="missing inputs"):
        pm()
    with pytest.raises(px.UserError, match="expected a torch.nn.Module"):
        px.from_torch(lambda x: x, (torch.ones(1),))
    dropout = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with pytest.raises(px.UserError, match="model.eval()"):
        px.from_torch(dropout, (torch.ones(2, 4),))
    monkeypatch.setitem(sys.modules, "torch", None)  # as without PyTorch installed
    with pytest.raises(px.UserError, match=r"pip install 'parallax\[torch\]'"):
        px.from_torch(object(), ())
