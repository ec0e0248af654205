"""A seq2seq model on PyTorch's own torch.nn.Transformer, sized by a TransformerConfig.

Embeddings + sinusoidal positions + dropout, nn.Transformer (post-LN, batch_first), output
Linear. nn.Transformer always adds a final LayerNorm to its encoder and decoder (two more
LayerNorms than torch_reference); everything else has the same shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.sinusoid import sinusoidal_table


class NNTransformerModel(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.pad_id = cfg.pad_id
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model)
        table = torch.from_numpy(sinusoidal_table(cfg.max_len, cfg.d_model)).float()
        self.register_buffer("positions", table, persistent=False)
        self.dropout = nn.Dropout(cfg.dropout_rate)
        self.transformer = nn.Transformer(
            d_model=cfg.d_model,
            nhead=cfg.num_heads,
            num_encoder_layers=cfg.num_encoder_layers,
            num_decoder_layers=cfg.num_decoder_layers,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout_rate,
            activation=cfg.activation,
            layer_norm_eps=cfg.layer_norm_eps,
            batch_first=True,
            norm_first=cfg.norm_first,
        )
        self.lm_head = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)

    def _embed(self, table: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return self.dropout(table(tokens) + self.positions[: tokens.shape[1]][None])

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_pad = src == self.pad_id  # torch.nn: True = blocked
        tgt_pad = tgt == self.pad_id
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.bool)
        hidden = self.transformer(
            self._embed(self.src_embed, src),
            self._embed(self.tgt_embed, tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return self.lm_head(hidden)
