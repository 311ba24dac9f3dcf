"""px.create_sharded_model with a zero-argument factory: the seed's call as written, params drawn
shard by shard on their devices (docs/python.md, "Sharding")."""

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import parallax as px


class Model(px.nn.Module):
    """A small LM whose call is its loss (the seed's models return the loss)."""

    def __init__(self, vocab, dim, layers):
        self.embed = px.nn.Embedding(vocab, dim)
        self.blocks = [px.nn.Mlp(dim, 4 * dim, seed=i) for i in range(layers)]
        self.norm = px.nn.LayerNorm(dim)

    def __call__(self, tokens, targets):
        x = self.embed(tokens)
        for b in self.blocks:
            x = x + b(x)
        return px.nn.cross_entropy_loss(self.embed.attend(self.norm(x)), targets)


def _batch(seed, vocab=64, length=9):
    t = np.random.default_rng(seed).integers(0, vocab, size=(8, length)).astype(np.int32)
    return t[:, :-1].copy(), t[:, 1:].copy()


def test_the_seeds_call_as_written(tmp_path):
    # PX_DEVICES is read once per process (when the first default mesh is made): a fresh interpreter.
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import parallax as px
from test_factory import Model, _batch
step = px.create_sharded_model(model_or_fn=lambda: Model(64, 32, 2), sample_inputs=_batch(0),
                               strategy=px.ShardingStrategy.FSDP, data_axis_name="data", model_axis_name="model")
state = step.init()
print(step.plan().mesh, step(state, *_batch(1)).loss > 0)
"""
    env = dict(os.environ, PX_DEVICES="cpu:8")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Mesh{data: 8, model: 1} on cpu:8 True" in out.stdout


def test_a_factory_model_trains_like_one_device():
    step = px.create_sharded_model(lambda: Model(64, 32, 2), _batch(0), strategy="FSDP",
                                   mesh=px.Mesh.cpu([("data", 8), ("model", 1)]))
    assert step.devices == 8 and "blocks.1.fc.w" in step.table()
    one = px.create_sharded_model(lambda: Model(64, 32, 2), _batch(0), strategy="DDP",
                                  mesh=px.Mesh.cpu([("data", 1), ("model", 1)]))
    s8, s1 = step.init(), one.init()
    # The same counter-based draws on any mesh: the params agree bit for bit.
    for path, a, b in zip(step.paths, step.gather_params(s8), one.gather_params(s1)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
    params = step.named_params(s8)
    w = np.asarray(params["blocks.0.fc.w"])
    assert abs(w.std() * np.sqrt(32) - 1) < 0.1  # lecun_normal: std 1/sqrt(fan_in)
    np.testing.assert_array_equal(np.asarray(params["norm.scale"]), np.ones(32, np.float32))
    assert abs(np.asarray(params["embed.table"]).std() - 0.02) < 0.002
    for i in range(3):
        a, b = step(s8, *_batch(i)), one(s1, *_batch(i))
        assert abs(a.loss - b.loss) <= 1e-6 * max(1.0, abs(a.loss)), (a, b)
    other = step.gather_params(step.init(7))[step.paths.index("blocks.0.fc.w")]
    assert not np.array_equal(np.asarray(other), w)  # another seed, other draws


def test_creating_an_fsdp_model_from_a_factory_never_holds_the_whole_model():
    vocab, dim, layers = 512, 256, 4
    mesh = px.Mesh.cpu([("data", 8), ("model", 1)])
    sample = [(px.int32, (8, 16))] * 2
    tracemalloc.start()
    try:
        eager = Model(vocab, dim, layers)  # built on the host: NumPy holds every param
        whole = sum(int(np.prod(p.shape)) * 4 for p in eager.parameters())
        largest = max(int(np.prod(p.shape)) * 4 for p in eager.parameters())
        assert tracemalloc.get_traced_memory()[1] >= whole
        del eager
        tracemalloc.reset_peak()
        # Creating the step traces and compiles it: no param is drawn (the factory's are deferred).
        step = px.create_sharded_model(lambda: Model(vocab, dim, layers), sample, strategy="FSDP", mesh=mesh)
        on_device = [px.memory_stats(d).bytes_in_use for d in range(8)]
        before = px.platform_memory_stats().bytes_in_use
        px.reset_platform_peak_memory()
        state = step.init()  # each device draws its own shards
        python_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    after = px.platform_memory_stats()
    held, peak = after.bytes_in_use - before, after.peak_bytes_in_use - before
    assert python_peak < whole / 4, (python_peak, whole)  # NumPy never held a param
    assert peak <= held + largest, (peak, held, largest)  # the state's shards and one param being drawn
    # Params and AdamW's two slots, each split 8 ways: 3/8 of the model per device (replicated,
    # each device would hold 3 times the model).
    for d in range(8):
        assert px.memory_stats(d).bytes_in_use - on_device[d] < whole / 2, d
    assert step(state, *_batch(1, vocab, 17)).loss > 0


def test_factory_mistakes_are_named():
    with pytest.raises(px.UserError, match=r"a callable taking \['params'\]; pass a zero-argument factory"):
        px.create_sharded_model(lambda params: Model(64, 32, 1), _batch(0), strategy="DDP")
    with pytest.raises(px.UserError, match="the factory returned a function"):
        px.create_sharded_model(lambda: (lambda: 0), _batch(0), strategy="DDP")

    class Logits(Model):
        def __call__(self, tokens, targets):
            return self.embed.attend(self.embed(tokens))

    with pytest.raises(px.UserError, match=r"must return the scalar loss; it returned a Tensor of shape \(8, 8, 64\)"):
        px.create_sharded_model(lambda: Logits(64, 32, 1), _batch(0), strategy="DDP",
                                mesh=px.Mesh.cpu([("data", 1)]))
    with pytest.raises(px.UserError, match="has no values: a create_sharded_model factory's params"):
        px.create_sharded_model(lambda: np.asarray(px.nn.Linear(2, 2).w), _batch(0), strategy="DDP")
