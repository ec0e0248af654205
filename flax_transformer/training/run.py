"""A finished (or running) train.py workdir, loaded: config, kind, tokenizer, latest params."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from flax_transformer.nn.kinds import abstract_variables, model_for
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import SEQ2SEQ
from flax_transformer.training.checkpoint import Checkpointer
from flax_transformer.training.tokenizer import load_tokenizer


@dataclasses.dataclass
class RunArtifacts:
    config: TransformerConfig
    model_kind: str  # one of spec.kinds.MODEL_KINDS
    params: dict  # {"params": ...} from the latest checkpoint
    tokenizer: Any
    step: int = 0

    @property
    def model(self):
        return model_for(self.config, self.model_kind)


def load_run(workdir: str | Path) -> RunArtifacts:
    """Config, tokenizer and the latest checkpoint's params of a train.py workdir."""
    workdir = Path(workdir)
    for name in ("config.json", "run.json", "tokenizer.json"):
        if not (workdir / name).exists():
            raise ValueError(f"{workdir} is not a train.py workdir: {name} is missing")
    config = TransformerConfig.load(workdir / "config.json")
    run = json.loads((workdir / "run.json").read_text())
    kind = run.get("model", SEQ2SEQ)
    tokenizer = load_tokenizer(workdir / "tokenizer.json")
    model = model_for(config, kind)
    abstract = abstract_variables(model)["params"]
    checkpointer = Checkpointer(workdir / "checkpoints", create=False)
    try:
        step = checkpointer.latest_step()
        if step is None:
            raise ValueError(f"{workdir / 'checkpoints'}: no checkpoint found")
        params = checkpointer.restore_params(abstract, step)
    finally:
        checkpointer.close()
    params = jax.tree.map(np.asarray, params)
    return RunArtifacts(config, kind, {"params": params}, tokenizer, step)
