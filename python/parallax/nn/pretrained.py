"""The built-in Transformer LMs from Python: Hugging Face checkpoints (GPT-2, Llama, Mistral,
Qwen2), their logits, and decoding with a key/value cache (px::nn pretrained.h)."""

from __future__ import annotations

import os
import weakref

from .. import _core
from .._array import asarray
from .._core import Executable, TransformerLm


class Pretrained:
    """A loaded checkpoint: model (a px.nn.TransformerLm), params (px.Arrays in
    model.store.paths() order) and architecture ("GPT2LMHeadModel", ...)."""

    def __init__(self, model, params, architecture):
        self.model, self.params, self.architecture = model, params, architecture

    def generate(self, prompts, **options):
        return generate(self.model, self.params, prompts, **options)

    def logits(self, tokens):
        return logits(self.model, self.params, tokens)

    def __repr__(self):
        return f"Pretrained({self.architecture}, {len(self.params)} params)"


def from_pretrained(directory) -> Pretrained:
    """Reads a Hugging Face model directory (config.json and model.safetensors, or shards)."""
    model, params, arch = _core.load_pretrained(os.fspath(directory))
    return Pretrained(model, params, arch)


def save_pretrained(model: TransformerLm, params, directory, architecture: str = "") -> None:
    """Writes config.json and model.safetensors that transformers loads."""
    _core.save_pretrained(model, [asarray(p) for p in params], os.fspath(directory), architecture)


def generate(model: TransformerLm, params, prompts, *, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0,
             seed=0, eos_id=-1, use_cache=True, platform="cpu") -> list[list[int]]:
    """Continues each prompt (lists of token ids, all of one length); returns the new ids. The
    programs run on device 0 of `platform` ("cpu", "ref", ...), the params copied there once."""
    return _core.generate(model, [asarray(p) for p in params], [list(map(int, p)) for p in prompts],
                          max_new_tokens, temperature, top_k, top_p, seed, eos_id, use_cache, platform)


_programs: "weakref.WeakKeyDictionary[TransformerLm, dict]" = weakref.WeakKeyDictionary()


def logits(model: TransformerLm, params, tokens):
    """The model's logits f32[B, S, vocab] for int32 tokens [B, S] (compiled once per shape)."""
    tokens = asarray(tokens, "int32")
    cache = _programs.setdefault(model, {})
    shape = tuple(tokens.shape)
    exe = cache.get(shape)
    if exe is None:
        graph = _core.trace_with_params(model.store, lambda batch: [model.logits(batch[0])],
                                        [(_core.DType.i32, list(shape))])
        exe = cache[shape] = Executable.compile(graph)
    return exe.run([asarray(p) for p in params] + [tokens])[0]
