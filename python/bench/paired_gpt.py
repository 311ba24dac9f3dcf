"""The Python bench-gpt against build/bench/gpt_step, run in pairs (same model, batch and steps, f32)
so that both see the same load on a shared machine; the order alternates from pair to pair.

    python python/bench/paired_gpt.py [--bin build/bench/gpt_step] [--pairs 3] [--steps 5] [--batch 8]

Prints each run's JSON line, then one JSON object: the median of the per-pair ratios (Python
tokens/s over C++ tokens/s), and both kernel counts and planned peaks (the same program has the
same ones)."""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def last_json(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"paired_gpt: no JSON in the output:\n{text}")
    return json.loads(lines[-1])


def run(cmd) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"paired_gpt: {' '.join(map(str, cmd))} failed:\n{done.stdout}{done.stderr}")
    out = last_json(done.stdout)
    print(json.dumps(out), flush=True)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="build/bench/gpt_step")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    cpp_cmd = [a.bin, "--dtype", "f32", "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch)]
    py_cmd = [sys.executable, str(HERE / "gpt_step.py"), "bench_gpt", str(a.batch), str(a.steps), "--solo"]
    ratios, cpp_runs, py_runs = [], [], []
    for i in range(a.pairs):
        if i % 2 == 0:
            c, py = run(cpp_cmd), run(py_cmd)
        else:
            py, c = run(py_cmd), run(cpp_cmd)
        cpp_runs.append(c)
        py_runs.append(py)
        ratios.append(py["tokens_per_s"] / c["tokens_per_s"])
    print(json.dumps({
        "bench": "paired_python_vs_cpp_gpt_step", "pairs": a.pairs, "steps": a.steps, "batch": a.batch,
        "ratios": [round(r, 3) for r in ratios], "median_ratio": round(statistics.median(ratios), 3),
        "cpp_median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in cpp_runs),
        "python_median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in py_runs),
        "kernels": {"cpp": cpp_runs[0]["kernels"], "python": py_runs[0]["kernels"]},
        "peak_bytes": {"cpp": cpp_runs[0]["peak_bytes"], "python": py_runs[0]["peak_bytes"]},
        "loss": {"cpp": cpp_runs[0]["loss"], "python": py_runs[0]["loss"]}}))


if __name__ == "__main__":
    main()
