"""The Flax step the benchmark times: the project's own train step
(flax_transformer.training.steps.make_train_step: forward, label-smoothed loss, backward, clip,
AdamW), jitted with the state donated, as train.py runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bench import setup
from flax_transformer.nn.model import Transformer
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.training.optim import make_optimizer
from flax_transformer.training.state import create_train_state
from flax_transformer.training.steps import make_train_step


def build_flax_step(cfg: TransformerConfig, batch: dict[str, np.ndarray]):
    """(state, jitted step(state, batch) -> (state, metrics), batch on the device)."""
    model = Transformer(cfg)
    optimizer = make_optimizer(
        setup.LEARNING_RATE,
        weight_decay=setup.WEIGHT_DECAY,
        clip_norm=setup.CLIP_NORM,
        b1=setup.BETAS[0],
        b2=setup.BETAS[1],
        eps=setup.ADAM_EPS,
    )
    state = create_train_state(model, optimizer, seed=0)
    step = make_train_step(model, optimizer, label_smoothing=setup.LABEL_SMOOTHING)
    return state, jax.jit(step, donate_argnums=0), jax.tree.map(jnp.asarray, batch)


def step_loss(metrics) -> float:
    return float(metrics["loss_sum"] / metrics["token_count"])  # float() waits for the step
