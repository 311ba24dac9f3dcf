"""Runs docs/notebooks/getting_started.ipynb top to bottom (nbclient) and checks its outputs."""

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
