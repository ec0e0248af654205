"""GPT-2: a pre-LN decoder-only LM with a final LayerNorm (`ln_f`), gelu_new (tanh), learned
positions from 0, a tied head; its Conv1D weights are stored (in, out) and c_attn packs
query | key | value on the out axis. No pad token: masks come from attention_mask."""

from __future__ import annotations

import re

from flax_transformer.hf.families.family import Family, FusedQKV, HFConfig, first_id
from flax_transformer.hf.families.field_types import integer, number, probability
from flax_transformer.spec.kinds import LM


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a GPT-2 config.json (decoder only, pre-LN, learned
    positions; pad_id falls back to eos, then 0); a differing embd_pdrop goes to `warnings`."""
    d_model = hf["n_embd"]
    resid, embd = hf.get("resid_pdrop", 0.1), hf.get("embd_pdrop", 0.1)
    if embd != resid:
        warnings.append(
            f"embd_pdrop={embd} differs from resid_pdrop={resid}: training uses {resid} for both"
        )
    eos, pad = first_id(hf.get("eos_token_id")), hf.get("pad_token_id")
    return dict(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        d_model=d_model,
        num_heads=hf["n_head"],
        num_encoder_layers=0,
        num_decoder_layers=hf["n_layer"],
        d_ff=hf.get("n_inner") or 4 * d_model,
        dropout_rate=resid,
        attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        max_len=hf["n_positions"],
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        norm_first=True,
        final_norm=True,
        tie_output=hf.get("tie_word_embeddings", True),
        positional="learned",
        # No pad token in GPT-2: masks come from attention_mask; pad_id only names a filler.
        pad_id=pad if pad is not None else (eos if eos is not None else 0),
    )


GPT2 = Family(
    model_types=("gpt2",),
    kind=LM,
    architectures=("GPT2LMHeadModel", "GPT2Model"),
    required=("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
    legacy_values=dict(
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        add_cross_attention=False,
        is_decoder=False,
    ),
    default_activation="gelu_new",
    config_to_switches=config_to_switches,
    weight_renames=(
        ("transformer.wte.weight", "tgt_embed.weight"),
        ("transformer.wpe.weight", "pos_embed.weight"),
        ("transformer.ln_f.{p}", "decoder.norm.{p}"),
        ("lm_head.weight", "lm_head.weight"),
        ("transformer.h.{i}.ln_1.{p}", "decoder.layers.{i}.norm1.{p}"),
        ("transformer.h.{i}.ln_2.{p}", "decoder.layers.{i}.norm2.{p}"),
        ("transformer.h.{i}.attn.c_proj.{p}", "decoder.layers.{i}.self_attn.out.{p}"),
        ("transformer.h.{i}.mlp.c_fc.{p}", "decoder.layers.{i}.ffn.linear1.{p}"),
        ("transformer.h.{i}.mlp.c_proj.{p}", "decoder.layers.{i}.ffn.linear2.{p}"),
    ),
    prefix="transformer.",
    tied_groups=lambda hf: [["transformer.wte.weight", "lm_head.weight"]],
    ignored_keys=re.compile(r"\.attn\.(bias|masked_bias)$"),  # causal-mask buffers
    transposed_keys=re.compile(
        r"^transformer\.h\.\d+\.(attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$"
    ),
    fused_qkv=FusedQKV(
        hf_template="transformer.h.{i}.attn.c_attn.{p}",
        canonical_template="decoder.layers.{i}.self_attn.{name}.{p}",
        transposed=True,
    ),
    max_positions_key="n_positions",
    field_types=dict(  # GPT2Config's declared types
        vocab_size=integer(),
        n_positions=integer(),
        n_embd=integer(),
        n_layer=integer(),
        n_head=integer(),
        n_inner=integer(optional=True),
        resid_pdrop=probability(),
        embd_pdrop=probability(),
        attn_pdrop=probability(),
        layer_norm_epsilon=number(min=0, min_exclusive=True),
    ),
    width_and_heads=(("n_embd", "n_head"),),
)
