"""The run as the PyTorch twin (torch_reference with the run's weights converted), the graphs
the torch-based exporters trace (encoder, decoder), and the float32 check they share."""

from __future__ import annotations

import torch

import torch_reference
from flax_transformer.export.output import ExportError
from flax_transformer.interop.convert import flax_to_torch_state
from flax_transformer.spec.kinds import LM


def torch_twin(run) -> torch.nn.Module:
    """torch_reference.Transformer / TransformerLM with the run's weights, in eval mode."""
    cls = torch_reference.TransformerLM if run.model_kind == LM else torch_reference.Transformer
    model = cls(run.config)
    torch_reference.load_numpy_state(model, flax_to_torch_state(run.params["params"]))
    return model.eval()


class EncoderGraph(torch.nn.Module):
    """src (B, S) -> encoded (B, S, d_model); source padding is masked (pad_id)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, src):
        """src (B, S) int64 -> encoded (B, S, d_model)."""
        return self.model.encode(src)


class DecoderGraph(torch.nn.Module):
    """(encoded (B, S, d_model), src (B, S), tgt_in (B, T)) -> logits (B, T, V). src gives
    the cross-attention padding mask; the target mask is causal + padding, as in training."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, encoded, src, tgt_in):
        """encoded (B, S, d_model), src (B, S), tgt_in (B, T) -> logits (B, T, tgt_vocab_size)."""
        src_mask = torch_reference.make_padding_mask(src, self.model.config.pad_id)
        return self.model.decode(encoded, tgt_in, src_mask)


def example_tokens(config, batch: int = 2, length: int = 3) -> torch.Tensor:
    """A (batch, length) int64 example for tracing; sizes >= 2, since tracers specialise 1."""
    if config.max_len < 2:
        raise ExportError(f"max_len {config.max_len} is too short to trace dynamic lengths")
    length = min(length, config.max_len)
    token = min(3, config.src_vocab_size - 1, config.tgt_vocab_size - 1)
    return torch.full((batch, length), token, dtype=torch.int64)
