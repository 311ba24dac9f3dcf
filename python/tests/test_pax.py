import json

import pytest

import parallax as px

OVERRIDES = {"train.steps": 10, "schedule.warmup_steps": 2}


def test_pax_train_from_python_writes_the_job_dir(tmp_path):
    r = px.pax.train("copy.TransformerLmTiny", job_log_dir=tmp_path, overrides=OVERRIDES)
    assert (r.first_step, r.last_step) == (0, 10)
    assert r.last_loss > 0 and "train step 10" in r.log
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("step") == 10 for m in lines)
    assert (tmp_path / "checkpoints").is_dir()
    # resuming: a second call with more steps continues from the checkpoint
    r2 = px.pax.train("copy.TransformerLmTiny", job_log_dir=tmp_path, overrides={**OVERRIDES, "train.steps": 12})
    assert (r2.first_step, r2.last_step) == (10, 12)
    ev = px.pax.evaluate("copy.TransformerLmTiny", tmp_path, overrides=OVERRIDES)
    assert ev.step == 12 and ev.loss > 0


def test_pax_overrides_are_validated():
    with pytest.raises(px.Error, match="optimizer.lr"):
        px.pax.experiment("copy.TransformerLmTiny", {"optimizer.lr": "fast"})
    with pytest.raises(px.Error, match="unknown experiment"):
        px.pax.experiment("nope.Nothing")


def test_register_an_experiment_from_python():
    def smaller():
        return px.pax.experiment("copy.TransformerLmTiny", {"model.n_layers": 1})

    px.pax.register_experiment("py.TinyCopy1Layer", "one layer", smaller)
    assert "py.TinyCopy1Layer" in dict(px.pax.list_experiments())
    assert px.pax.experiment("py.TinyCopy1Layer").get("model.n_layers") == "1"
    assert "blocks.0" in px.pax.plan("py.TinyCopy1Layer", devices="cpu:2", overrides={"sharding.mesh": "data:2"})


def test_decode_continues_a_prompt(tmp_path):
    px.pax.train("copy.TransformerLmTiny", job_log_dir=tmp_path, overrides=OVERRIDES)
    d = px.pax.decode("copy.TransformerLmTiny", tmp_path, "1 2 3 4", overrides=OVERRIDES, max_new_tokens=4)
    assert d.step == 10 and list(d.prompt_ids) == [1, 2, 3, 4] and len(d.new_ids) == 4
