"""Runs the notebooks in docs/notebooks (getting_started, from_pytorch) top to bottom (nbclient) and checks
their outputs."""

import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("matplotlib")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "getting_started.ipynb"


def _text(cell):
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o["text"])
        elif "data" in o and "text/plain" in o["data"]:
            out.append(o["data"]["text/plain"])
    return "".join(out)


def test_getting_started_notebook_runs_and_learns(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    # the plan was printed: per-param specs and AUTO's explanation
    assert "AUTO on Mesh{data: 2, model: 2} on cpu:4" in text
    assert "blocks.0.mlp.fc.w" in text and "why:" in text
    # the loss fell
    first, last = map(float, re.search(r"first loss ([\d.]+) last loss ([\d.]+)", text).groups())
    assert last < first - 1.0, (first, last)
    # a plot and a continued prompt
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert "The meaning of " in text


def test_from_pytorch_notebook_trains_like_pytorch(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = NOTEBOOK.parent / "from_pytorch.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
    # the converted model's logits are torch's, and AUTO sharded its torch-named params
    assert float(re.search(r"max \|parallax - torch\| / max \|torch\| = (\S+)", text).group(1)) < 1e-5
    assert "AUTO on Mesh{data: 2, model: 2} on cpu:4" in text and "transformer.h.0.attn.c_attn.weight" in text
    # it learned, and its loss curve is PyTorch's
    first, last = map(float, re.search(r"first loss ([\d.]+) last loss ([\d.]+)", text).groups())
    assert last < first - 1.0, (first, last)
    early, worst = map(float, re.search(r"first 10 steps at most (\S+), all steps at most (\S+)", text).groups())
    assert early < 1e-5 and worst < 1e-2, (early, worst)
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
