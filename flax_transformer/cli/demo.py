"""Demo: build the torch twin, convert its weights to Flax, and print the parity measured.

ftx demo [--seed N]   (or python -m flax_transformer.demo)
"""

from __future__ import annotations

import argparse

import numpy as np

from flax_transformer.cli.output import add_json_flag, emit
from flax_transformer.cli.process import exit_process

# The parity the project promises (DESIGN.md): float64 ~1e-12, float32 ~1e-5, relative.
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the demo's flags (--seed only); an argparse error (exit 2) for a negative seed."""
    parser = argparse.ArgumentParser(
        prog="ftx demo",
        description="Build the PyTorch twin (the `small` preset), convert its weights to Flax and "
        "print the float64 and float32 logits error measured between the two. Writes no files.",
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs (default: 0)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Build the torch twin of the `small` preset, convert its weights to Flax and print the logits
    error between the two in float64 and float32 against the project's tolerances (--json: as
    JSON); exit status 0, 1 when one is over."""
    args = parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import torch

    import torch_reference
    from flax_transformer import Transformer, preset
    from flax_transformer.interop.convert import torch_state_to_flax
    from flax_transformer.spec.numerics import error_stats

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    lines = [
        "The PyTorch twin (torch_reference) of the `small` preset, its weights converted to "
        "Flax by the project's converter; the same inputs (ragged padding) through both:"
    ]
    result = {}
    for dtype in ("float64", "float32"):
        # train.py's default size; vocabularies that differ, so a wrong transpose cannot pass.
        config = preset(
            "small", src_vocab_size=300, tgt_vocab_size=320, dtype=dtype, param_dtype=dtype
        )
        torch_model = torch_reference.Transformer(config).eval()
        params = torch_state_to_flax(torch_reference.state_dict_to_numpy(torch_model), config)
        src = rng.integers(1, 300, (4, 24))
        tgt = rng.integers(1, 320, (4, 20))
        src[1, 15:] = config.pad_id  # ragged padding
        tgt[2, 11:] = config.pad_id
        with jax.default_matmul_precision("highest"):
            flax_logits = np.asarray(Transformer(config).apply(params, src, tgt))
        with torch.no_grad():
            torch_logits = torch_model(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
        max_abs, rel = error_stats(flax_logits, torch_logits)
        verdict = "within" if rel <= TOLERANCE[dtype] else "OVER"
        lines.append(
            f"{dtype}: logits {flax_logits.shape}, max abs error {max_abs:.3e}, relative error "
            f"{rel:.3e} ({verdict} the project's tolerance {TOLERANCE[dtype]:g})"
        )
        result[dtype] = {"max_abs_error": max_abs, "relative_error": rel,
                         "tolerance": TOLERANCE[dtype]}  # fmt: skip
    same = all(r["relative_error"] <= r["tolerance"] for r in result.values())
    lines.append(
        "the two frameworks compute the same function" if same else "a parity check FAILED"
    )
    emit(result, lines, args.json)
    return 0 if same else 1


if __name__ == "__main__":
    exit_process(main())
