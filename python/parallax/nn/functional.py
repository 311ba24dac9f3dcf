"""Neural-network ops on Tensors (like jax.nn): activations, norms, attention and losses."""

from __future__ import annotations

from .. import _core
from ..numpy import _tensor, check_indices, log_softmax, logsumexp, softmax  # noqa: F401


def gelu(x, approximate=True): return _core.gelu(_tensor(x), approximate)
def silu(x): return _core.silu(_tensor(x))
def sigmoid(x): return _core.sigmoid(_tensor(x))
def relu(x): return _core.maximum(_tensor(x), _core.zeros_like(_tensor(x)))


def layer_norm(x, scale, bias=None, eps=1e-5):
    """Normalizes the last axis: (x - mean) / sqrt(var + eps) * scale + bias."""
    return _core.layer_norm(_tensor(x), _tensor(scale), None if bias is None else _tensor(bias), eps)


def rms_norm(x, scale, eps=1e-6):
    return _core.rms_norm(_tensor(x), _tensor(scale), eps)


def dot_product_attention(q, k, v, causal=True, scale=None, key_padding=None):
    """q [B, H, Sq, D], k and v [B, Hkv, Sk, D] (grouped-query when Hkv < H) -> [B, H, Sq, D]."""
    return _core.dot_product_attention(_tensor(q), _tensor(k), _tensor(v), causal, scale,
                                       None if key_padding is None else _tensor(key_padding))


def _labels(op, logits, labels, ignore_index):
    """The labels as a Tensor; inside px.jit, one outside [0, classes) other than ignore_index is a
    px.UserError after the call (px.TrainStep checks its batch itself)."""
    logits, labels = _tensor(logits), _tensor(labels)
    check_indices(labels, logits.shape[-1], f"px.nn.{op}: labels", allowed=ignore_index)
    return logits, labels


def cross_entropy_loss(logits, labels, weights=None, ignore_index=-100):
    """Mean over non-ignored positions of -log softmax(logits)[label] (labels int32)."""
    logits, labels = _labels("cross_entropy_loss", logits, labels, ignore_index)
    return _core.cross_entropy_loss(logits, labels, None if weights is None else _tensor(weights), ignore_index)


def softmax_cross_entropy(logits, labels, ignore_index=-100):
    logits, labels = _labels("softmax_cross_entropy", logits, labels, ignore_index)
    return _core.softmax_cross_entropy(logits, labels, ignore_index)


def one_hot(indices, depth, dtype=_core.DType.f32):
    return _core.one_hot(_tensor(indices), depth, dtype)


def dropout(key, x, rate):
    return _core.dropout(_tensor(key), _tensor(x), rate)


def apply_rope(x, theta=10000.0, offset=0):
    """Rotary positions on x [..., S, D] (pairs (i, i + D/2) rotated by position * theta^(-2i/D))."""
    return _core.apply_rope(_tensor(x), theta, offset)
