"""`python -m flax_transformer.interop`: build a torch.nn.Transformer, move it to Flax, and print
the output differences (JSON) on PyTorch's regular path and its fast path."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from flax_transformer.interop.nn_transformer import generate_square_subsequent_mask
from flax_transformer.interop.nn_transformer_weights import from_torch


def main(argv: list[str] | None = None) -> int:
    """Build a torch.nn.Transformer, move it to Flax, and print the output differences (JSON)
    on random inputs with a causal target mask and source padding, on PyTorch's regular path
    and its fast path."""
    import argparse
    import json
    import sys

    import torch

    parser = argparse.ArgumentParser(
        prog="python -m flax_transformer.interop",
        description="Check that NNTransformer reproduces torch.nn.Transformer (default sizes: "
        "torch's defaults).",
    )
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--nhead", type=int, default=8)
    parser.add_argument("--num-encoder-layers", type=int, default=6)
    parser.add_argument("--num-decoder-layers", type=int, default=6)
    parser.add_argument("--dim-feedforward", type=int, default=2048)
    parser.add_argument("--activation", choices=("relu", "gelu"), default="relu")
    parser.add_argument("--norm-first", action="store_true")
    parser.add_argument("--no-bias", action="store_true")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    try:
        torch_model = torch.nn.Transformer(
            d_model=args.d_model,
            nhead=args.nhead,
            num_encoder_layers=args.num_encoder_layers,
            num_decoder_layers=args.num_decoder_layers,
            dim_feedforward=args.dim_feedforward,
            activation=args.activation,
            norm_first=args.norm_first,
            bias=not args.no_bias,
            batch_first=True,
            dtype=getattr(torch, args.dtype),
        ).eval()
    except (AssertionError, ValueError, RuntimeError) as err:
        print(f"error: invalid nn.Transformer settings: {err}", file=sys.stderr)
        return 2
    with jax.enable_x64(args.dtype == "float64"):
        report = _compare_with_torch(torch_model, args)
    print(json.dumps(report, indent=2))
    return 0


def _compare_with_torch(torch_model, args) -> dict[str, Any]:
    import torch

    from flax_transformer.spec.numerics import error_stats

    module, params = from_torch(torch_model)
    rng = np.random.default_rng(args.seed)
    src = rng.standard_normal((args.batch, args.src_len, args.d_model)).astype(args.dtype)
    tgt = rng.standard_normal((args.batch, args.tgt_len, args.d_model)).astype(args.dtype)
    lengths = rng.integers(1, args.src_len + 1, size=args.batch)
    padding = np.arange(args.src_len)[None, :] >= lengths[:, None]
    tgt_mask = np.asarray(generate_square_subsequent_mask(args.tgt_len, args.dtype))
    masks = dict(tgt_mask=tgt_mask, src_key_padding_mask=padding, memory_key_padding_mask=padding)
    with jax.default_matmul_precision("highest"):
        actual = np.asarray(jax.jit(module.apply)(params, src, tgt, **masks))
    report: dict[str, Any] = {"settings": vars(args)}
    previous = torch.backends.mha.get_fastpath_enabled()
    tensors = {k: torch.from_numpy(v) for k, v in masks.items()}
    try:
        for name, fast in (("regular_path", False), ("fast_path", True)):
            torch.backends.mha.set_fastpath_enabled(fast)
            with torch.no_grad():
                expected = torch_model(torch.from_numpy(src), torch.from_numpy(tgt), **tensors)
            max_abs, rel = error_stats(actual, expected.numpy())
            report[name] = {"max_abs_error": max_abs, "relative_error": rel}
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)
    return report


if __name__ == "__main__":
    raise SystemExit(main())
