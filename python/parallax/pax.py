"""pax from Python: run the registered experiments (the `pax` CLI's train, eval, decode, plan).

    r = px.pax.train("copy.TransformerLmTiny", job_log_dir="/tmp/job", overrides={"train.steps": 20})
    print(r.last_loss, r.log)
"""

from __future__ import annotations

import os

from ._core import _pax
from ._core._pax import ExperimentConfig, list_experiments  # noqa: F401


class TrainResult:
    """first_step, last_step, last_loss, last_eval_loss, interrupted, and the log pax printed."""

    def __init__(self, result, log: str):
        self.first_step = result.first_step
        self.last_step = result.last_step
        self.last_loss = result.last_loss
        self.last_eval_loss = result.last_eval_loss
        self.interrupted = result.interrupted
        self.log = log

    def __repr__(self):
        return f"TrainResult(steps {self.first_step}..{self.last_step}, last_loss={self.last_loss:.4f})"


def _text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)


def experiment(name_or_config, overrides: dict | None = None) -> ExperimentConfig:
    """The named experiment (or a copy of a config) with overrides {"dotted.path": value} applied
    and validated as `pax --set` would."""
    cfg = ExperimentConfig(name_or_config) if isinstance(name_or_config, ExperimentConfig) else \
        _pax.experiment(name_or_config)
    for path, value in (overrides or {}).items():
        cfg.set(path, _text(value))
    return cfg


def train(exp, job_log_dir, overrides: dict | None = None, devices: str = "") -> TrainResult:
    """Trains the experiment in job_log_dir (resuming from its latest checkpoint), like
    `pax train --exp=... --job_log_dir=... --set k=v`."""
    cfg = experiment(exp, overrides)
    result, log = _pax.train(cfg, os.fspath(job_log_dir), devices)
    return TrainResult(result, log)


def evaluate(exp, job_log_dir, overrides: dict | None = None, step: int | None = None):
    return _pax.evaluate(experiment(exp, overrides), os.fspath(job_log_dir), step)


def decode(exp, job_log_dir, prompt: str, overrides: dict | None = None, **options):
    """Continues prompt with the job's latest checkpoint (max_new_tokens, temperature, top_k, seed)."""
    return _pax.decode(experiment(exp, overrides), os.fspath(job_log_dir), prompt, **options)


def plan(exp, overrides: dict | None = None, devices: str = "", cluster: str = "") -> str:
    """The `pax plan` report: mesh, strategy, per-param table, bytes per device."""
    return _pax.plan(experiment(exp, overrides), devices, cluster)


def describe(exp, overrides: dict | None = None) -> str:
    return experiment(exp, overrides).describe()


def register_experiment(name: str, summary: str, fn) -> None:
    """Registers fn() -> ExperimentConfig under name (e.g. px.pax.experiment(base, overrides))."""
    _pax.register_experiment(name, summary, fn)
