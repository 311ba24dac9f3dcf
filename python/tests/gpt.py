"""A small GPT written with px.nn, mirroring px::nn::TransformerLm's GPT-2 flavour op for op
(pre-norm blocks, learned positions, tied embedding), so the two agree on the same weights."""

import parallax as px
from parallax import nn


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, seed):
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.CausalSelfAttention(d_model, n_heads, bias=True, seed=seed)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Mlp(d_model, d_ff, seed=seed + 1)

    def __call__(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class GPT(nn.Module):
    def __init__(self, vocab, d_model, n_heads, n_layers, d_ff, max_seq_len, seed=0):
        self.embed = nn.Embedding(vocab, d_model, seed=seed)
        self.pos_embed = nn.Embedding(max_seq_len, d_model, seed=seed + 1)
        self.blocks = [Block(d_model, n_heads, d_ff, seed + 10 * (i + 1)) for i in range(n_layers)]
        self.final_norm = nn.LayerNorm(d_model)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.pos_embed.table[: tokens.shape[1]]
        for block in self.blocks:
            x = block(nn.tag(x, "layer_input"))
        return self.embed.attend(self.final_norm(nn.tag(x, "layers_end")))


def loss_fn(model, tokens, targets):
    return nn.cross_entropy_loss(model(tokens), targets)


def config():
    return px.nn.LmConfig.gpt2("tiny", 64, 32, 2, 2, 64, 16)


def python_gpt_like(cfg, seed=0):
    return GPT(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.max_seq_len, seed=seed)


class LlamaBlock(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff, eps, seed):
        self.ln1 = nn.RMSNorm(d_model, eps)
        self.attn = nn.CausalSelfAttention(d_model, n_heads, n_kv_heads, rope=True, seed=seed)
        self.ln2 = nn.RMSNorm(d_model, eps)
        self.mlp = nn.SwiGlu(d_model, d_ff, seed=seed + 1)

    def __call__(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class Llama(nn.Module):
    """px::nn::TransformerLm's Llama flavour: RMSNorm, SwiGLU, rotary positions, untied head."""

    def __init__(self, cfg, seed=0):
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, seed=seed)
        self.blocks = [LlamaBlock(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.norm_eps, seed + i + 1)
                       for i in range(cfg.n_layers)]
        self.final_norm = nn.RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False, seed=seed + 99)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(nn.tag(x, "layer_input"))
        return self.head(self.final_norm(nn.tag(x, "layers_end")))
