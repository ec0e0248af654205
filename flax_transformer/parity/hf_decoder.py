"""compare_modules for decoder LMs: transformers' PyTorch Llama, Mistral, Qwen2, Qwen3, Gemma,
Gemma 2, Gemma 3 (text), Phi-3 (and GPT-2: the same machinery, its own names) causal LMs
against this project's Flax decoder of the same checkpoint (`flax_transformer.hf.load(path)`),
without writing the module-name mapping by hand.

    report = compare_hf_decoder(torch_model, hf.load(path), ids, mask)
    report.ok, report.first_divergence, report.diagnosis.verdict, print(report.format_table())

Every module output is compared in torch execution order (embed_tokens, each layer's
input_layernorm, q/k/v/o projections, q/k norms, self_attn, post_attention_layernorm,
gate/up/down projections, mlp and the layer itself, the final norm, lm_head, the logits);
padded tokens are left out. `decoder_module_names(tied, model_type)` is the mapping. Modules
whose value the Flax side does not have are EXCLUDE, listed as "missing": the rotary tables
(the Flax attention computes them inside), the gate's activation alone (the Flax feed-forward
keeps silu(gate) * up only), GPT-2's fused c_attn (three values on the Flax side) and, with
tied embeddings, lm_head (its output is the logits, compared at the root). GPT-2's position
rows are compared as the rows each token reads (the Flax module's output minus its input).
Gemma's embedding is compared scaled by sqrt(hidden_size) (transformers' module includes the
scale); Gemma 2 / 3's norms after each sublayer pair with attn_out_norm / ffn_out_norm;
Gemma 3's q / k norms run on heads-first tensors, compared transposed.
Phi-3's fused qkv_proj and gate_up_proj are compared part by part: a copy of the torch model
has their outputs cut into modules of their own (`qkv_proj.query` | `.key` | `.value`,
`gate_up_proj.gate` | `.up`; fused_parts.py), each paired with its Flax projection, so a bug in
one part is named there; the fused output itself is "missing".

transformers computes RMSNorm and the rotary tables in float32 even in a float64 model (about
1e-7 relative). In float64 `compare_hf_decoder` therefore runs transformers with those two
parts patched to float64 (`transformers_float64_norms_and_rotary`; the report's info says so);
`patch_float32_parts=False` compares against transformers as it is.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re

import numpy as np

from flax_transformer.nn.attention import make_causal_mask
from flax_transformer.parity.fused_parts import with_parts
from flax_transformer.parity.hf_bert import real_tokens, token_array
from flax_transformer.parity.inputs import ParityInputError
from flax_transformer.parity.modules import compare_modules
from flax_transformer.parity.pairing import EXCLUDE
from flax_transformer.parity.report import ParityReport
from flax_transformer.parity.transforms import minus_input, times_in_own_dtype, transpose

# transformers' model_type -> the class prefix of its RMSNorm / RotaryEmbedding.
FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
FAMILIES.update(gemma="Gemma", gemma2="Gemma2", gemma3_text="Gemma3", phi3="Phi3")

# A layer's modules (after `model.layers.N.`) -> the Flax path under `decoder/layers_N/`.
DECODER_LAYER = {
    "input_layernorm": "norm1",
    "self_attn.q_proj": "self_attn/query",
    "self_attn.k_proj": "self_attn/key",
    "self_attn.v_proj": "self_attn/value",
    "self_attn.q_norm": "self_attn/query_norm",  # Qwen3
    "self_attn.k_norm": "self_attn/key_norm",
    "self_attn.o_proj": "self_attn/out",
    "self_attn": "self_attn",
    "post_attention_layernorm": "norm2",
    "mlp.gate_proj": "ffn/linear1",
    "mlp.act_fn": EXCLUDE,  # silu(gate) alone: the Flax side keeps silu(gate) * up only
    "mlp.up_proj": "ffn/linear3",
    "mlp.down_proj": "ffn/linear2",
    "mlp": "ffn",
}
LLAMA_BASE = {
    "embed_tokens": "tgt_embed",
    "rotary_emb": EXCLUDE,  # cos / sin tables: computed inside the Flax attention
    "norm": "decoder/norm",
}
# Gemma 2 / 3: a norm after each sublayer too (the Flax side's attn_out_norm / ffn_out_norm).
GEMMA2_LAYER = {
    **DECODER_LAYER,
    "post_attention_layernorm": "attn_out_norm",
    "pre_feedforward_layernorm": "norm2",
    "post_feedforward_layernorm": "ffn_out_norm",
}
# Phi-3: its fused projections compared part by part (fused_parts.py cuts their outputs into
# modules of their own: `qkv_proj.query`, ...); the fused output itself has no Flax value.
PHI3_LAYER = {
    **{k: v for k, v in DECODER_LAYER.items() if "_proj" not in k or "o_proj" in k},
    "self_attn.qkv_proj": EXCLUDE,
    "self_attn.qkv_proj.fused": EXCLUDE,
    **{f"self_attn.qkv_proj.{part}": f"self_attn/{part}" for part in ("query", "key", "value")},
    "resid_attn_dropout": "Dropout_0",
    "mlp.gate_up_proj": EXCLUDE,
    "mlp.gate_up_proj.fused": EXCLUDE,
    "mlp.gate_up_proj.gate": "ffn/linear1",
    "mlp.gate_up_proj.up": "ffn/linear3",
    "mlp.activation_fn": EXCLUDE,
    "mlp.down_proj": "ffn/linear2",
    "resid_mlp_dropout": "Dropout_1",
}
# GPT-2 (`transformer.h.N.`): the same machinery, its own names. Its fused c_attn (q, k and v in
# one output) has no single Flax value (the Flax side has three): EXCLUDE.
GPT2_LAYER = {
    "ln_1": "norm1",
    "attn.c_attn": EXCLUDE,
    "attn.c_proj": "self_attn/out",
    "attn.resid_dropout": "Dropout_0",
    "attn": "self_attn",
    "ln_2": "norm2",
    "mlp.c_fc": "ffn/linear1",
    "mlp.act": "ffn/Dropout_0",  # Flax calls the activation as a function; the dropout keeps it
    "mlp.c_proj": "ffn/linear2",
    "mlp.dropout": "Dropout_1",
    "mlp": "ffn",
}
GPT2_BASE = {
    "wte": "tgt_embed",
    "wpe": "pos_embed",  # the rows each token reads: the Flax module adds them to its input
    "drop": "embed_dropout",
    "ln_f": "decoder/norm",
}
# model_type -> (the base model's name, its layer list, a layer's modules, the base's modules)
LAYOUTS = {
    **{model_type: ("model", "layers", DECODER_LAYER, LLAMA_BASE) for model_type in FAMILIES},
    "gemma2": ("model", "layers", GEMMA2_LAYER, LLAMA_BASE),
    "gemma3_text": ("model", "layers", GEMMA2_LAYER, LLAMA_BASE),
    "phi3": ("model", "layers", PHI3_LAYER, LLAMA_BASE),
    "gpt2": ("transformer", "h", GPT2_LAYER, GPT2_BASE),
}


def flax_transforms(model_type: str, config) -> dict | None:
    """The Flax tensors brought into transformers' layout: GPT-2's position rows (what the
    module adds); the Gemmas' embedding times sqrt(hidden_size), which transformers' scaled
    embedding module includes and the Flax model applies after its table."""
    if model_type == "gpt2":
        return {"pos_embed": minus_input()}
    if config.scale_embeddings:
        return {"tgt_embed": times_in_own_dtype(np.sqrt(config.d_model), "sqrt(d_model)")}
    return None


# Gemma 3 norms q and k per head after moving the heads first: (batch, heads, len, head_dim).
TORCH_TRANSFORMS = {"gemma3_text": {r".*self_attn\.[qk]_norm": transpose(0, 2, 1, 3)}}


def fused_parts(model_type: str, hf_config: dict) -> dict:
    """Phi-3's fused projections by module name -> their parts (fused_parts.with_parts)."""
    if model_type != "phi3":
        return {}
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    query = heads * head_dim
    key = value = (hf_config.get("num_key_value_heads") or heads) * head_dim
    inner = hf_config["intermediate_size"]
    parts = {}
    for i in range(hf_config["num_hidden_layers"]):
        parts[f"model.layers.{i}.self_attn.qkv_proj"] = (
            ("query", query), ("key", key), ("value", value),
        )  # fmt: skip
        parts[f"model.layers.{i}.mlp.gate_up_proj"] = (("gate", inner), ("up", inner))
    return parts


def decoder_module_names(tied: bool = False, model_type: str = "llama"):
    """The mapping (torch module name -> Flax path, None or EXCLUDE) for a `*ForCausalLM` of
    `model_type` (the Llama lineage or "gpt2"; a bare `*Model` too) against
    `hf.load(path).module`; `tied`: the model ties lm_head to the embeddings
    (`hf.load(path).config.tie_output`)."""
    if model_type not in LAYOUTS:
        raise ParityInputError(f"model_type {model_type!r} is not one of {sorted(LAYOUTS)}")
    base, layers, layer_parts, fixed = LAYOUTS[model_type]
    layer = re.compile(rf"{layers}\.(\d+)(?:\.(.+))?")

    def mapping(name: str):
        if name == "lm_head":
            return EXCLUDE if tied else "lm_head"
        if name == base:  # the base model inside the LM: its last hidden state
            return "decoder"
        inner = name.removeprefix(base + ".")
        if inner in fixed:
            return fixed[inner]
        match = layer.fullmatch(inner)
        if match is None:
            return None  # the root: the canonical rule pairs it
        index, rest = match.groups()
        if rest is None:
            return f"decoder/layers_{index}"
        target = layer_parts.get(rest)
        if target is None or target is EXCLUDE:
            return target
        return f"decoder/layers_{index}/{target}"

    return mapping


@contextlib.contextmanager
def transformers_float64_norms_and_rotary(model_config):
    """transformers' parts that compute in float32 even in a float64 model (~1e-7 relative
    noise in the logits), computed in float64, the rest untouched:
    - the RMS norms (Llama's kin and Gemma's offset ones cast to float32);
    - the rotary tables: this project's float64 frequencies (longrope's: the table of each
      call's length) (spec/rotary.py, checked against
      transformers' to float32 rounding in parity_tests/test_llm_switches.py), installed into
      each model's rotary module when it runs (Gemma 3: the local or global table by layer type);
    - Gemma's embedding scale: a float32 buffer sqrt(hidden_size), kept at float32's rounding
      by .double(); here sqrt(hidden_size) in the model's dtype;
    - Gemma 2's eager attention softmax, in float32 whatever the input dtype: a float64 model's
      mask minimum becomes -inf there and left-padded rows give NaN logits; here in the
      input's dtype."""
    import torch
    import transformers.models as models

    from flax_transformer.spec import rotary

    def frequencies(position_ids, layer_type=None):
        rope = rotary.layer_rope(model_config, layer_type == "sliding_attention")
        if rope.rope_scaling == "longrope":  # the table of this call's length
            length = int(position_ids.max()) + 1
            inv_freq = torch.from_numpy(rotary.longrope_frequencies(rope, length, np))
        else:
            inv_freq = torch.from_numpy(rotary.inverse_frequencies(rope))
        return inv_freq, rotary.attention_factor(rope)

    def norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def offset_norm(self, x):
        return self._norm(x) * (1.0 + self.weight)

    def rope(self, x, position_ids, layer_type=None):
        inv_freq, scale = frequencies(position_ids, layer_type)
        freqs = position_ids[..., None].double() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    def scaled_embedding(self, input_ids):
        scale = torch.tensor(self.scalar_embed_scale, dtype=self.weight.dtype)
        return torch.nn.Embedding.forward(self, input_ids) * scale

    gemma2 = models.gemma2.modeling_gemma2

    def eager_softmax_in_input_dtype(
        module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
        **kwargs,
    ):  # fmt: skip
        """gemma2.eager_attention_forward with its softmax in the input's dtype."""
        key = gemma2.repeat_kv(key, module.num_key_value_groups)
        value = gemma2.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if softcap is not None:
            weights = torch.tanh(weights / softcap) * softcap
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.softmax(weights, dim=-1)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    plain = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
    plain["phi3"] = "Phi3"
    gemmas = {"gemma": "Gemma", "gemma2": "Gemma2", "gemma3": "Gemma3"}
    patched = []
    for name, prefix in {**plain, **gemmas}.items():
        module = getattr(getattr(models, name), f"modeling_{name}")
        patched += [
            (
                getattr(module, f"{prefix}RMSNorm"),
                "forward",
                norm if name in plain else offset_norm,
            ),
            (getattr(module, f"{prefix}RotaryEmbedding"), "forward", rope),
        ]
        if name in gemmas:
            scaled = getattr(module, f"{prefix}TextScaledWordEmbedding", None)
            patched.append((scaled, "forward", scaled_embedding))
    patched.append((gemma2, "eager_attention_forward", eager_softmax_in_input_dtype))
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patched]
    for owner, attr, value in patched:
        setattr(owner, attr, value)
    try:
        yield
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


def left_padded_positions(mask: np.ndarray) -> np.ndarray:
    """position_ids as transformers' generate makes them for a left-padded batch: each row's
    real tokens count from 0, padding at 0."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def random_left_padded(vocab_size: int, batch: int, length: int, seed: int = 0):
    """(input_ids, attention_mask) of a random left-padded ragged batch: row i has a length
    between 1 and `length` (the first row the whole width), ids in [0, vocab_size)."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([[length], rng.integers(1, length + 1, batch - 1)])
    mask = (np.arange(length)[None] >= length - lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(0, vocab_size, (batch, length)), 0)
    return ids, mask


def compare_hf_decoder(
    torch_model,
    hf_model,
    input_ids,
    attention_mask=None,
    position_ids=None,
    *,
    dtype: str = "float64",
    rtol: float | None = None,
    patch_float32_parts: bool = True,
) -> ParityReport:
    """compare_modules of transformers' `torch_model` (LlamaForCausalLM, Mistral..., Qwen2...,
    Qwen3..., GPT2LMHeadModel) against `hf_model` (what `flax_transformer.hf.load` returns, or
    anything with its `.module`, `.variables`, `.config` and `.hf_config`) on one batch:
    `input_ids` (batch, len), `attention_mask` (nonzero on real tokens; None: all real),
    `position_ids` (None: as transformers' generate makes them for a left-padded batch). Both
    sides run at `dtype` (float64: float64 copies of the weights; the Llama lineage's RMS norms
    and rotary tables patched to float64 in transformers unless `patch_float32_parts` is
    False). Padded tokens are left out. To find a bug in your own Flax variables or config,
    pass `dataclasses.replace(hf_model, variables=...)` (or `module=`)."""
    model_type = hf_model.hf_config.get("model_type")
    torch_type = getattr(getattr(torch_model, "config", None), "model_type", None)
    if model_type not in LAYOUTS:
        raise ParityInputError(
            f"model_type {model_type!r} is not a decoder LM this compares (one of "
            f"{sorted(LAYOUTS)})"
        )
    if torch_type != model_type:
        raise ParityInputError(
            f"the torch model is a {torch_type!r} model, the Flax one {model_type!r}: compare a "
            "checkpoint with the model it was loaded from"
        )
    ids = token_array("input_ids", input_ids)
    mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) != 0
    if mask.shape != ids.shape:
        raise ParityInputError(f"attention_mask has shape {mask.shape}, input_ids {ids.shape}")
    if position_ids is None:
        positions = left_padded_positions(mask)
    else:
        positions = token_array("position_ids", position_ids)
        if positions.shape != ids.shape:
            raise ParityInputError(
                f"position_ids has shape {positions.shape}, input_ids {ids.shape}"
            )
    import torch

    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
    torch_kwargs = {k: torch.from_numpy(np.asarray(v, np.int64)) for k, v in inputs.items()}
    causal = np.asarray(make_causal_mask(ids.shape[1]))
    flax_kwargs = {"mask": causal & mask[:, None, None, :], "positions": positions.astype(np.int32)}
    patched = patch_float32_parts and dtype == "float64" and model_type in FAMILIES
    context = (
        transformers_float64_norms_and_rotary(hf_model.config)
        if patched
        else contextlib.nullcontext()
    )
    parts = fused_parts(model_type, hf_model.hf_config)
    if parts:  # on a copy: the caller's model stays as it is
        torch_model = with_parts(copy.deepcopy(torch_model), parts)
    with context:
        report = compare_modules(
            torch_model,
            (),
            hf_model.module,
            hf_model.variables,
            (ids,),
            torch_kwargs=torch_kwargs,
            flax_kwargs=flax_kwargs,
            dtype=dtype,
            rtol=rtol,
            mask=real_tokens(mask),
            mapping=decoder_module_names(bool(hf_model.config.tie_output), model_type),
            transforms=TORCH_TRANSFORMS.get(model_type),
            flax_transforms=flax_transforms(model_type, hf_model.config),
        )
    what = "RMSNorm and rotary tables in float64" if patched else "as it is"
    info = {**report.info, "transformers": what}
    return dataclasses.replace(report, info=info)
