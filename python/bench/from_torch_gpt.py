"""A training step of a transformers GPT-2 three ways, on the same weights and batch, in one process:
px.from_torch of the torch model, the same model written with px.nn (python/tests/gpt.py, the HF
weights loaded into it), and torch eager (forward, backward, AdamW step).

    python python/bench/from_torch_gpt.py [--d 256 --layers 4 --heads 4 --seq 128 --batch 8 --vocab 2048 --rounds 15]

Each round runs one step of each, the order rotating from round to round (a shared machine's load
changes: pairs that run back to back see the same load). Prints one JSON object: the median step
time of each, and per-round ratios (from_torch over px.nn, torch eager over from_torch) as their
median, min and max, each one's fastest step (the least disturbed by other load), and the same for
the CPU seconds of all threads (time.process_time); the first losses of the three agree (the same
model and weights)."""

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import parallax as px  # noqa: E402
from gpt import GPT, loss_fn  # noqa: E402


def px_nn_weights(hf, d):
    """The HF GPT-2's weights under python/tests/gpt.py's param paths."""
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    out = {"embed.table": sd["transformer.wte.weight"], "pos_embed.table": sd["transformer.wpe.weight"],
           "final_norm.scale": sd["transformer.ln_f.weight"], "final_norm.bias": sd["transformer.ln_f.bias"]}
    for i in range(hf.config.n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        w, bias = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
        for j, name in enumerate("qkv"):
            out[b + f"attn.w{name}"] = w[:, j * d:(j + 1) * d]
            out[b + f"attn.b{name}"] = bias[j * d:(j + 1) * d]
        out[b + "attn.wo"], out[b + "attn.bo"] = sd[h + "attn.c_proj.weight"], sd[h + "attn.c_proj.bias"]
        for ln, mine in (("ln_1", "ln1"), ("ln_2", "ln2")):
            out[b + f"{mine}.scale"], out[b + f"{mine}.bias"] = sd[h + f"{ln}.weight"], sd[h + f"{ln}.bias"]
        out[b + "mlp.fc.w"], out[b + "mlp.fc.b"] = sd[h + "mlp.c_fc.weight"], sd[h + "mlp.c_fc.bias"]
        out[b + "mlp.proj.w"], out[b + "mlp.proj.b"] = sd[h + "mlp.c_proj.weight"], sd[h + "mlp.c_proj.bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def main():
    p = argparse.ArgumentParser()
    for name, default in (("d", 256), ("layers", 4), ("heads", 4), ("seq", 128), ("batch", 8), ("vocab", 2048),
                          ("rounds", 15)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.d, n_layer=a.layers, n_head=a.heads,
                                  n_inner=4 * a.d, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0,
                                  eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(cfg)
    rng = np.random.default_rng(0)
    t = rng.integers(0, a.vocab, size=(a.batch, a.seq + 1)).astype(np.int32)
    tokens, targets = np.ascontiguousarray(t[:, :-1]), np.ascontiguousarray(t[:, 1:])

    converted = px.from_torch(hf, (torch.from_numpy(tokens).long(),), {"use_cache": False})
    written = GPT(a.vocab, a.d, a.heads, a.layers, 4 * a.d, a.seq).load_state_dict(px_nn_weights(hf, a.d))
    sample = [(px.int32, (a.batch, a.seq))] * 2
    opt = px.optim.adamw(1e-4)
    steps = {"from_torch": px.TrainStep(converted, loss_fn, opt, sample),
             "px_nn": px.TrainStep(written, loss_fn, opt, sample)}
    states = {k: s.init() for k, s in steps.items()}
    torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    tt, tg = torch.from_numpy(tokens).long(), torch.from_numpy(targets).long().reshape(-1)

    def torch_step():
        torch_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(hf(tt, use_cache=False).logits.reshape(-1, a.vocab), tg)
        loss.backward()
        torch_opt.step()
        return loss.item()

    runs = {"from_torch": lambda: steps["from_torch"](states["from_torch"], tokens, targets).loss,
            "px_nn": lambda: steps["px_nn"](states["px_nn"], tokens, targets).loss,
            "torch_eager": torch_step}
    first = {k: f() for k, f in runs.items()}  # compiles; the same model and weights: the same loss
    for f in runs.values():
        f()
    times = {k: [] for k in runs}
    cpu = {k: [] for k in runs}  # CPU seconds of all threads: less swayed by other processes than wall time
    order = list(runs)
    for r in range(a.rounds):
        for k in order[r % 3:] + order[:r % 3]:
            start, start_cpu = time.perf_counter(), time.process_time()
            runs[k]()
            times[k].append(time.perf_counter() - start)
            cpu[k].append(time.process_time() - start_cpu)

    def ratios(num, den, of=times):
        rs = [x / y for x, y in zip(of[num], of[den])]
        return {"median": round(statistics.median(rs), 3), "min": round(min(rs), 3), "max": round(max(rs), 3)}

    print(json.dumps({
        "bench": "from_torch_gpt2_step", "d": a.d, "layers": a.layers, "seq": a.seq, "batch": a.batch,
        "vocab": a.vocab, "rounds": a.rounds, "first_loss": {k: round(v, 5) for k, v in first.items()},
        "median_step_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "min_step_s": {k: round(min(v), 4) for k, v in times.items()},
        "kernels": {k: s.num_kernels() for k, s in steps.items()},
        "median_cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "from_torch_over_px_nn_time": ratios("from_torch", "px_nn"),
        "torch_eager_over_from_torch_time": ratios("torch_eager", "from_torch"),
        "from_torch_over_px_nn_cpu": ratios("from_torch", "px_nn", cpu),
        "torch_eager_over_from_torch_cpu": ratios("torch_eager", "from_torch", cpu)}))


if __name__ == "__main__":
    main()
