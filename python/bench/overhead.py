"""Per-call Python overhead of px.jit and px.TrainStep (a benchmark, not a test).

    python python/bench/overhead.py

Prints one JSON object per measurement: the median time of a call through the Python API and of
the same compiled program called directly through the extension (parallax._core), and the
difference, which is what the Python layer adds (pytree flattening, array checks, the cache)."""

import json
import statistics
import time

import numpy as np

import parallax as px
import parallax.numpy as pnp


def median_us(fn, n=2000, warmup=50):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def report(name, api_us, direct_us):
    print(json.dumps({"bench": name, "api_us": round(api_us, 2), "direct_us": round(direct_us, 2),
                      "python_overhead_us": round(api_us - direct_us, 2)}))


def main():
    x = px.asarray(np.ones((8, 8), np.float32))
    f = px.jit(lambda x: x * 2.0 + 1.0)
    f(x)
    exe = f.executable(x)
    report("jit_small_elementwise", median_us(lambda: f(x)), median_us(lambda: exe.run([x])))

    class Mlp(px.nn.Module):
        def __init__(self):
            self.l1, self.l2 = px.nn.Linear(16, 32), px.nn.Linear(32, 16)

        def __call__(self, x):
            return self.l2(px.nn.gelu(self.l1(x)))

    xb = np.ones((4, 16), np.float32)
    step = px.TrainStep(Mlp(), lambda m, x: pnp.mean(pnp.square(m(x) - x)), px.optim.adamw(1e-3), [xb])
    state = step.init()
    xa = px.asarray(xb)
    report("train_step_small_mlp", median_us(lambda: step(state, xa), n=500),
           median_us(lambda: step._cpp(state, [xa]), n=500))
    # A NumPy batch: adopted each call (px.asarray without a copy), against a px.Array batch.
    report("train_step_small_mlp_numpy_batch", median_us(lambda: step(state, xb), n=500),
           median_us(lambda: step._cpp(state, [xa]), n=500))


if __name__ == "__main__":
    main()
