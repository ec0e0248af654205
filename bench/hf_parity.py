"""The parity table of docs/hf.md: hf.load's logits against transformers' own PyTorch models.

    python -m bench.hf_parity [--json OUT]

Builds the tiny random Marian / BART / mBART / GPT-2 models and the briefly trained T5-family
models of tests/hf_models.py (transformers'
classes, saved with save_pretrained to a temporary directory, nothing downloaded) and measures,
on the tests' ragged batches, the relative error max|flax - hf| / max|hf| of the logits in
float64 (both sides double) and in float32: the same measurement tests/test_hf_load.py asserts
(<= 1e-12 and <= 1e-5).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import jax

from flax_transformer.spec.numerics import error_stats
from tests import hf_models

SWITCHES = {
    "marian": "swish, scaled embeddings, shared + tied embeddings, [sin, cos] halves positions, "
    "final_logits_bias, pad-id decoder start",
    "bart": "gelu, embedding LayerNorm, learned positions offset 2, final_logits_bias",
    "mbart": "as bart + pre-LN with final LayerNorms, scaled embeddings",
    "gpt2": "gelu_new, tied head, pre-LN + ln_f, left-padded batch with attention_mask",
}
# The T5 family (tests/hf_models.T5_MODELS, trained briefly): float64 against transformers with
# its norms computing the variance in float64 (it takes it in float32 even in float64).
T5_SWITCHES = {
    "t5": "RMS norm, relative bias shared by the layers, relu, unscaled logits, no biases, "
    "output scaled before the tied head, 3 decoder layers over 2",
    "t5_v1_1": "gated gelu_new, its own lm_head, heads of d_kv 6 (3 x 6 != d_model 16)",
    "mt5": "as v1.1, never scaled",
    "umt5": "one relative bias per layer",
    "t5_encoder": "T5EncoderModel: the last hidden state",
    "mt5_encoder": "MT5EncoderModel",
    "umt5_encoder": "UMT5EncoderModel",
}


def measure() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in SWITCHES:
            torch_model = hf_models.build(model_type)
            path = hf_models.save(torch_model, Path(tmp) / model_type)
            row = {"model_type": model_type, "switches": SWITCHES[model_type]}
            with jax.enable_x64(True):
                pair = hf_models.logits_pair(model_type, torch_model, path, "float64")
            row["float64_rel_err"] = error_stats(*pair)[1]
            pair = hf_models.logits_pair(model_type, torch_model, path, "float32")
            row["float32_rel_err"] = error_stats(*pair)[1]
            rows.append(row)
        for name, switches in T5_SWITCHES.items():
            torch_model = hf_models.build_t5(name)
            path = Path(tmp) / name
            torch_model.save_pretrained(path)
            row = {"model_type": name, "switches": switches}
            with jax.enable_x64(True):
                pair = hf_models.t5_outputs_pair(name, torch_model, path, "float64")
            row["float64_rel_err"] = error_stats(*pair)[1]
            pair = hf_models.t5_outputs_pair(name, torch_model, path, "float32")
            row["float32_rel_err"] = error_stats(*pair)[1]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hf_parity", description=__doc__)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = measure()
    print("| model | float64 rel. error | float32 rel. error | what it exercises |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['model_type']} | {row['float64_rel_err']:.1e} | "
            f"{row['float32_rel_err']:.1e} | {row['switches']} |"
        )
    if args.json:
        machine = {"platform": platform.platform(), "jax": jax.__version__}
        args.json.write_text(json.dumps({"rows": rows, "machine": machine}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
