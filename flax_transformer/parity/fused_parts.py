"""A fused torch projection whose output parts are modules of their own, so that the parity
capture records each part: Phi-3's `qkv_proj` (query | key | value) and `gate_up_proj` (gate |
up) against the Flax side's separate query / key / value and linear1 / linear3.

`with_parts(model, {"model.layers.0.self_attn.qkv_proj": (("query", 24), ("key", 12), ...)})`
returns `model` with each named module replaced by a `FusedParts` holding it (`NAME.fused`) and
one identity module per part (`NAME.query`, ...): the output is the same tensor, cut and put
back together. A part holds its rows of the fused weight (and bias) as buffers, so the parity
diagnosis judges a diverging part by its own weights. Call it on a copy: the model changes in
place.
"""

from __future__ import annotations


def with_parts(model, parts: dict[str, tuple[tuple[str, int], ...]]):
    """`model` with each module of `parts` (its name -> (part name, width) along the output's
    last axis, in order) wrapped in a FusedParts."""
    import torch

    class Part(torch.nn.Module):
        """Its input as it is; its rows of the fused weight (and bias) as buffers."""

        def __init__(self, fused, start: int, stop: int):
            super().__init__()
            self.register_buffer("weight", fused.weight.detach()[start:stop], persistent=False)
            if fused.bias is not None:
                self.register_buffer("bias", fused.bias.detach()[start:stop], persistent=False)

        def forward(self, x):
            return x

    class FusedParts(torch.nn.Module):
        def __init__(self, fused, widths):
            super().__init__()
            self.fused = fused
            self.names = [name for name, _ in widths]
            self.widths = [width for _, width in widths]
            start = 0
            for name, width in widths:
                self.add_module(name, Part(fused, start, start + width))
                start += width

        def forward(self, x):
            pieces = torch.split(self.fused(x), self.widths, dim=-1)
            named = zip(self.names, pieces, strict=True)
            return torch.cat([getattr(self, name)(piece) for name, piece in named], dim=-1)

    for name, widths in parts.items():
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        fused = getattr(owner, attr)
        if fused.out_features != sum(width for _, width in widths):
            raise ValueError(
                f"{name}: {fused.out_features} outputs, parts {widths} of another total"
            )
        setattr(owner, attr, FusedParts(fused, widths))
    return model
