import numpy as np
import pytest

import parallax as px


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    path = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def test_from_pretrained_logits_match_transformers(hf_gpt2):
    import torch

    hf, path = hf_gpt2
    p = px.nn.from_pretrained(path)
    assert p.architecture == "GPT2LMHeadModel" and p.model.config.n_layers == 2
    ids = np.random.default_rng(0).integers(0, 64, size=(2, 12)).astype(np.int32)
    got = np.asarray(p.logits(ids))
    with torch.no_grad():
        want = hf(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_generate_matches_transformers_greedy(hf_gpt2):
    import torch

    hf, path = hf_gpt2
    p = px.nn.from_pretrained(path)
    prompt = [[5, 17, 33, 2]]
    new = p.generate(prompt, max_new_tokens=6)
    with torch.no_grad():
        out = hf.generate(torch.tensor(prompt), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert new == [out[0, 4:].tolist()]


def test_fine_tune_then_save_for_transformers(hf_gpt2, tmp_path, rng):
    import torch
    import transformers

    _, path = hf_gpt2
    p = px.nn.from_pretrained(path)
    step = px.TrainStep(p.model, None, px.optim.adamw(1e-2), [(px.int32, (2, 12))] * 2)
    state = step.init(p.params)
    t = rng.integers(0, 64, size=(2, 13)).astype(np.int32)
    losses = [step(state, t[:, :-1].copy(), t[:, 1:].copy()).loss for _ in range(5)]
    assert losses[-1] < losses[0]
    params = step.gather_params(state)
    px.nn.save_pretrained(p.model, params, tmp_path)
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = np.ascontiguousarray(t[:, :12])
    with torch.no_grad():
        want = back(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(np.asarray(px.nn.logits(p.model, params, ids)), want, atol=1e-4, rtol=1e-4)


def test_sentencepiece_round_trip(tmp_path):
    docs = px.data.read_gcide(300)
    px.text.train_sentencepiece(docs, str(tmp_path / "spm.model"), vocab_size=512)
    tok = px.text.load_tokenizer(str(tmp_path / "spm.model"))
    assert tok.kind == "sentencepiece" and tok.vocab_size == 512 and tok.eos_id == 3
    ids = tok.encode("The meaning of a word")
    assert all(0 <= i < 512 for i in ids) and tok.decode(ids) == "The meaning of a word"


def test_missing_checkpoint_is_an_error(tmp_path):
    with pytest.raises(px.Error, match="config.json"):
        px.nn.from_pretrained(tmp_path)
