"""px.nn: neural-network ops (functional), modules and the built-in Transformer LMs."""

from .._core import Init, LmConfig, MlpKind, NormKind, PositionKind, TransformerLm  # noqa: F401
from .functional import (  # noqa: F401
    apply_rope,
    cross_entropy_loss,
    dot_product_attention,
    dropout,
    gelu,
    layer_norm,
    log_softmax,
    logsumexp,
    one_hot,
    relu,
    rms_norm,
    sigmoid,
    silu,
    softmax,
    softmax_cross_entropy,
)
from .modules import (  # noqa: F401
    CausalSelfAttention,
    Deferred,
    Embedding,
    LayerNorm,
    Linear,
    Mlp,
    Module,
    RMSNorm,
    SwiGlu,
    lecun_normal,
    normal,
    tag,
)
from .pretrained import Pretrained, from_pretrained, generate, logits, save_pretrained  # noqa: F401
