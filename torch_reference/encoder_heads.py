"""The torch twin of flax_transformer/nn/encoder_heads.py: the pooler, config.head's heads and
the positions of config.positions_skip_padding, with the same names."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from flax_transformer.spec.config import TransformerConfig


def skip_padding_positions(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The k-th non-pad token of a row has position k - 1, a pad token -1."""
    real = (tokens != pad_id).long()
    return torch.cumsum(real, dim=1) * real - 1


class Pooler(nn.Module):
    """tanh(dense(x[:, 0])) -> (batch, d_model)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)

    def forward(self, x):
        """x (batch, len, d_model) -> (batch, d_model)."""
        return torch.tanh(self.dense(x[:, 0]))


class EncoderHead(nn.Module):
    """config.head on the last hidden states, the pooler output and the token embedding."""

    def __init__(self, config: TransformerConfig, activation: nn.Module):
        super().__init__()
        self.kind = config.head
        d = config.d_model
        self.dropout = nn.Dropout(config.dropout_rate)
        if self.kind == "masked_lm":
            self.dense = nn.Linear(d, d)
            self.activation = activation
            self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
            self.bias = nn.Parameter(torch.zeros(config.src_vocab_size))
            return
        if self.kind in ("sequence_tanh", "sequence_relu"):
            self.pre_classifier = nn.Linear(d, d)
        self.classifier = nn.Linear(d, config.num_labels)

    def forward(self, x, pooled, embed: nn.Embedding):
        """(batch, num_labels), (batch, len, num_labels) or (batch, len, vocab) logits."""
        if self.kind == "sequence_pooled":
            return self.classifier(self.dropout(pooled))
        if self.kind in ("sequence_tanh", "sequence_relu"):
            h = self.pre_classifier(self.dropout(x[:, 0]))
            h = torch.tanh(h) if self.kind == "sequence_tanh" else F.relu(h)
            return self.classifier(self.dropout(h))
        if self.kind == "token":
            return self.classifier(self.dropout(x))
        h = self.norm(self.activation(self.dense(x)))
        return h @ embed.weight.T + self.bias
