"""Draws the timelines bench/pipeline wrote (--trace_dir DIR: one chrome trace per schedule) as one
picture per schedule: a row per device, a bar per action, as the run measured them.

    build/bench/pipeline --devices 4 --microbatches 8 --trace_dir /tmp/pp
    .venv-test/bin/python bench/pipeline_timeline.py /tmp/pp docs/images
"""

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#dd8452", "W": "#55a868", "u": "#8c8c8c"}


def draw(trace: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    devices = sorted({e["tid"] for e in spans})
    start = min(e["ts"] for e in spans)
    kind = trace.stem.removeprefix("pipeline_")
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(devices) + 1.0))
    for e in spans:
        row = len(devices) - 1 - devices.index(e["tid"])
        name = e["name"]
        ax.barh(row, e["dur"] / 1e3, left=(e["ts"] - start) / 1e3, height=0.8,
                color=COLOURS.get(name[0], "#8c8c8c"), edgecolor="white", linewidth=0.5)
        if e["dur"] / 1e3 > 4 and name != "update":
            ax.text((e["ts"] - start + e["dur"] / 2) / 1e3, row, name.split(".")[0], ha="center", va="center",
                    fontsize=6, color="white")
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels([f"device {d}" for d in reversed(devices)])
    ax.set_xlabel("ms since the step began (F forward, B backward, I input gradient, W weight gradient; grey: update)")
    ax.set_title(f"{kind}: every device's actions as bench/pipeline measured them")
    fig.tight_layout()
    out = out_dir / f"pipeline_{kind}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: pipeline_timeline.py TRACE_DIR OUT_DIR")
    src, out_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    traces = sorted(src.glob("pipeline_*.json"))
    if not traces:
        sys.exit(f"pipeline_timeline.py: no pipeline_*.json in {src}: run build/bench/pipeline --trace_dir {src}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in traces:
        print(draw(t, out_dir))


if __name__ == "__main__":
    main()
