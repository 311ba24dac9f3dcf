"""Tokens/s of a training step: the GPT defined in Python with px.nn (python/tests/gpt.py) against
the C++ px.nn.TransformerLm of the same config, in the same process, steps interleaved.

    python python/bench/gpt_step.py                   # gpt2_tiny, batch 8
    python python/bench/gpt_step.py bench_gpt 8 10    # bench/gpt_step's model: config, batch, steps
    python python/bench/gpt_step.py bench_gpt 8 5 --solo   # the Python GPT alone, timed like bench/gpt_step

Prints one JSON object: tokens/s of each (median over the steps), their ratio, the median of the
per-round ratios (each round runs one step of each, the order alternating) and the ratio of the
fastest steps, and both kernel counts and planned peaks; with --solo, the
Python GPT's step time (mean over the steps after 2 warm-up steps, as build/bench/gpt_step times
it), tokens/s, kernel count and planned peak bytes, for python/bench/paired_gpt.py to set beside
build/bench/gpt_step's."""

import json
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import parallax as px  # noqa: E402
from gpt import loss_fn, python_gpt_like  # noqa: E402


def solo(cfg, batch, steps, warmup=2):
    """The Python GPT alone, measured as bench/gpt_step measures the C++ model (AdamW, lr 3e-4)."""
    seq = cfg.max_seq_len
    model = python_gpt_like(cfg).load_state_dict(dict(zip(*_cpp_weights(cfg))))
    start = time.perf_counter()
    step = px.TrainStep(model, loss_fn, px.optim.adamw(3e-4), [(px.int32, (batch, seq))] * 2)
    compile_s = time.perf_counter() - start
    state = step.init()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
    targets = rng.integers(0, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
    for _ in range(warmup):
        step(state, tokens, targets)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(state, tokens, targets).loss
    dt = (time.perf_counter() - start) / steps
    print(json.dumps({"bench": "python_gpt_step", "config": cfg.name, "batch": batch, "seq": seq,
                      "step_s": round(dt, 4), "tokens_per_s": round(batch * seq / dt, 1),
                      "peak_bytes": step.peak_bytes(), "kernels": step.num_kernels(),
                      "compile_s": round(compile_s, 2), "loss": round(loss, 4)}))


def _cpp_weights(cfg):
    cpp = px.nn.TransformerLm(cfg)
    return cpp.store.paths(), cpp.init(0)


def main():
    args = [a for a in sys.argv[1:] if a != "--solo"]
    name = args[0] if len(args) > 0 else "gpt2_tiny"
    batch = int(args[1]) if len(args) > 1 else 8
    steps = int(args[2]) if len(args) > 2 else 20
    cfg = px.nn.LmConfig.preset(name)
    if "--solo" in sys.argv:
        return solo(cfg, batch, steps)
    seq = cfg.max_seq_len
    cpp_model = px.nn.TransformerLm(cfg)
    weights = dict(zip(cpp_model.store.paths(), cpp_model.init(0)))
    py_model = python_gpt_like(cfg).load_state_dict(weights)
    sample = [(px.int32, (batch, seq))] * 2
    opt = px.optim.adamw(1e-3)
    cpp_step, py_step = px.TrainStep(cpp_model, None, opt, sample), px.TrainStep(py_model, loss_fn, opt, sample)
    cpp_state, py_state = cpp_step.init(0), py_step.init()
    rng = np.random.default_rng(0)
    t = rng.integers(0, cfg.vocab_size, size=(batch, seq + 1)).astype(np.int32)
    tokens, targets = px.asarray(np.ascontiguousarray(t[:, :-1])), px.asarray(np.ascontiguousarray(t[:, 1:]))
    times = {"cpp": [], "python": []}
    runs = (("cpp", cpp_step, cpp_state), ("python", py_step, py_state))
    for i in range(steps + 2):
        for key, step, state in runs if i % 2 == 0 else runs[::-1]:  # the order alternates
            start = time.perf_counter()
            step(state, tokens, targets)
            if i >= 2:  # warm-up
                times[key].append(time.perf_counter() - start)
    tps = {k: batch * seq / statistics.median(v) for k, v in times.items()}
    # Each round's two steps saw about the same load: the median of their ratios is the robust one.
    pair_ratio = statistics.median(c / p for c, p in zip(times["cpp"], times["python"]))
    print(json.dumps({"bench": "python_vs_cpp_gpt_step", "config": name, "batch": batch, "seq": seq,
                      "cpp_tokens_per_s": round(tps["cpp"]), "python_tokens_per_s": round(tps["python"]),
                      "ratio": round(tps["python"] / tps["cpp"], 3), "median_pair_ratio": round(pair_ratio, 3),
                      "ratio_of_fastest": round(min(times["cpp"]) / min(times["python"]), 3),
                      "kernels": [cpp_step.num_kernels(), py_step.num_kernels()],
                      "peak_bytes": [cpp_step.peak_bytes(), py_step.peak_bytes()]}))

if __name__ == "__main__":
    main()
