"""Tokens/s of a training step: the GPT defined in Python with px.nn (python/tests/gpt.py) against
the C++ px.nn.TransformerLm of the same config, in the same process, steps interleaved.

    python python/bench/gpt_step.py                   # gpt2_tiny, batch 8
    python python/bench/gpt_step.py bench_gpt 8 10    # bench/gpt_step's model: config, batch, steps

Prints one JSON object: tokens/s of each (median over the steps) and their ratio."""

import json
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import parallax as px  # noqa: E402
from gpt import loss_fn, python_gpt_like  # noqa: E402


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "gpt2_tiny"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    cfg = px.nn.LmConfig.preset(name)
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
    for i in range(steps + 2):
        for key, step, state in (("cpp", cpp_step, cpp_state), ("python", py_step, py_state)):
            start = time.perf_counter()
            step(state, tokens, targets)
            if i >= 2:  # warm-up
                times[key].append(time.perf_counter() - start)
    tps = {k: batch * seq / statistics.median(v) for k, v in times.items()}
    print(json.dumps({"bench": "python_vs_cpp_gpt_step", "config": name, "batch": batch, "seq": seq,
                      "cpp_tokens_per_s": round(tps["cpp"]), "python_tokens_per_s": round(tps["python"]),
                      "ratio": round(tps["python"] / tps["cpp"], 3)}))


if __name__ == "__main__":
    main()
