#!/usr/bin/env python3
"""PyTorch peer for the Llama flavour of bench-gpt (`gpt_step --flavour llama`): one training step
(forward, backward, AdamW) of the same model written in PyTorch: RMSNorm, rotary positions,
grouped-query attention through scaled_dot_product_attention, SwiGLU, untied head, no biases.

Prints one JSON object like ../shared/peers/gpt_torch.py: tokens/s, achieved GFLOP/s
(6N + 12*L*d*S per token, N without the untied input embedding, a gather), step time.
Usage: llama_torch.py [--threads 2] [--dtype f32|bf16] [--compile 0|1] [--steps 5] [--vocab 8192
                      --d 512 --heads 8 --kv_heads 2 --layers 6 --ff 1536 --seq 256 --batch 8]
--compile 1 runs the step under torch.compile (its compile time is reported apart as compile_s).
Init: normal(0.02), the two projections into the residual stream scaled by 1/sqrt(2 layers).
"""
import argparse, json, math, time

import torch

p = argparse.ArgumentParser()
for name, default in [("vocab", 8192), ("d", 512), ("heads", 8), ("kv_heads", 2), ("layers", 6), ("ff", 1536),
                      ("seq", 256), ("batch", 8), ("threads", 2), ("steps", 5), ("warmup", 2)]:
    p.add_argument(f"--{name}", type=int, default=default)
p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
p.add_argument("--compile", type=int, choices=[0, 1], default=0)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(a.threads)
V, D, H, KV, L, F, S, B = a.vocab, a.d, a.heads, a.kv_heads, a.layers, a.ff, a.seq, a.batch
HD = D // H

# Rotary tables: position t, frequency i rotates the pair (x_i, x_{i + HD/2}) by t * theta^(-2i/HD).
inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
angles = torch.outer(torch.arange(S, dtype=torch.float32), inv_freq)
COS, SIN = angles.cos(), angles.sin()


def rotate(x):  # x: [b, heads, t, HD]
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return torch.cat((x1 * COS - x2 * SIN, x2 * COS + x1 * SIN), dim=-1)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(D, eps=1e-5), torch.nn.RMSNorm(D, eps=1e-5)
        self.q, self.o = torch.nn.Linear(D, D, bias=False), torch.nn.Linear(D, D, bias=False)
        self.k, self.v = torch.nn.Linear(D, KV * HD, bias=False), torch.nn.Linear(D, KV * HD, bias=False)
        self.gate, self.up = torch.nn.Linear(D, F, bias=False), torch.nn.Linear(D, F, bias=False)
        self.down = torch.nn.Linear(F, D, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.n1(x)
        q = rotate(self.q(h).view(b, t, H, HD).transpose(1, 2))
        k = rotate(self.k(h).view(b, t, KV, HD).transpose(1, 2))
        v = self.v(h).view(b, t, KV, HD).transpose(1, 2)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, D))
        h = self.n2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(L)])
        self.norm = torch.nn.RMSNorm(D, eps=1e-5)
        self.head = torch.nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


model = Llama()
for name, w in model.named_parameters():
    if w.dim() == 2:
        torch.nn.init.normal_(w, std=0.02 / (math.sqrt(2 * L) if name.endswith(("o.weight", "down.weight")) else 1))
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
n_params = sum(p.numel() for p in model.parameters())
x, y = torch.randint(0, V, (B, S)), torch.randint(0, V, (B, S))


def step_eager():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.float().view(-1, V), y.view(-1))
    loss.backward()
    opt.step()
    return loss.item()


step = torch.compile(step_eager) if a.compile else step_eager
c0 = time.perf_counter()
step()
compile_s = time.perf_counter() - c0
for _ in range(a.warmup - 1):
    step()
t0 = time.perf_counter()
for _ in range(a.steps):
    loss = step()
dt = (time.perf_counter() - t0) / a.steps
tokens = B * S
flops = 6 * (n_params - V * D) * tokens + 12 * L * D * S * tokens
print(json.dumps({"peer": "pytorch", "flavour": "llama", "version": torch.__version__, "dtype": a.dtype,
                  "threads": a.threads, "params": n_params, "step_s": round(dt, 4),
                  "tokens_per_s": round(tokens / dt, 1), "gflops": round(flops / dt / 1e9, 1),
                  "loss": round(loss, 4), "compile": a.compile,
                  "compile_s": round(compile_s, 2) if a.compile else None}))
