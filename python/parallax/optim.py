"""Optimizers (px::optim) for px.TrainStep, with optax-like names.

    opt = px.optim.adamw(learning_rate=px.optim.warmup_cosine(3e-3, 100, 1000), weight_decay=0.1)

The update is traced into the training step (one compiled program), so an optimizer here is a
description, applied by px.TrainStep; it has no separate init/update calls."""

from ._core import Optimizer, Schedule, adamw, linear_warmup, sgd, warmup_cosine  # noqa: F401
from ._core import constant_schedule as constant  # noqa: F401
from ._core import rsqrt_schedule as rsqrt  # noqa: F401


def adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """AdamW without weight decay."""
    return adamw(learning_rate, b1, b2, eps, 0.0)
