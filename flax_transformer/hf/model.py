"""HFModel: a Hugging Face checkpoint as a linen model with its variables, and load / save."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.hf.checkpoint import (
    has_tokenizer,
    read_hf_dir,
    write_hf_dir,
)
from flax_transformer.hf.config import check_hf_config, hf_to_config, model_kind
from flax_transformer.hf.families import Family, family_for
from flax_transformer.hf.length_buckets import bucket_length, pad_columns
from flax_transformer.hf.shards import DEFAULT_MAX_SHARD_SIZE, parse_shard_size
from flax_transformer.hf.tokenizer import load_pretrained_tokenizer
from flax_transformer.hf.weights import hf_state_to_params, params_to_lazy_hf_state
from flax_transformer.hf.xla_cpu import encoder_compiler_options
from flax_transformer.nn.attention import make_causal_mask
from flax_transformer.nn.int8_products import (
    int8_products_model,
    is_int8_products,
    quantize_for_products,
)
from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.config import DTYPES, TransformerConfig
from flax_transformer.spec.kinds import ENCODER, SEQ2SEQ


@dataclasses.dataclass(eq=False)
class HFModel:
    """A loaded Hugging Face model: run it with `forward` / `generate` (transformers' argument
    names, numpy in and out), or use `.module` and `.variables` as any linen model."""

    module: Any  # flax_transformer.nn.model.Transformer, TransformerLM or TransformerEncoder
    variables: dict[str, Any]  # {"params": ...}
    config: TransformerConfig
    hf_config: dict[str, Any]  # config.json, as read
    generation_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: Path | None = None  # the directory it was loaded from (tokenizer files)

    @property
    def kind(self) -> str:
        """This project's model kind of the checkpoint: "seq2seq", "lm" or "encoder"."""
        return model_kind(self.hf_config)

    @property
    def model_type(self) -> str:
        """config.json's model_type (e.g. "marian", "gpt2")."""
        return self.hf_config["model_type"]

    @property
    def family(self) -> Family:
        """The model's Hugging Face family (hf/families/): its mapping and defaults."""
        return family_for(self.model_type)

    @functools.cached_property
    def tokenizer(self):
        """transformers' AutoTokenizer for the source directory, or None (no tokenizer files,
        or transformers not installed)."""
        if self.source is None or not has_tokenizer(self.source):
            return None
        try:
            import transformers  # noqa: F401
        except ImportError:
            return None
        return load_pretrained_tokenizer(self.source)

    @functools.cached_property
    def _apply(self):
        if self.kind != ENCODER:
            return jax.jit(self.module.apply)
        cfg = self.config
        float32 = cfg.dtype == "float32" and not is_int8_products(self.module)
        return jax.jit(self.module.apply, compiler_options=encoder_compiler_options(float32))

    def forward(
        self,
        input_ids,
        attention_mask=None,
        decoder_input_ids=None,
        position_ids=None,
        token_type_ids=None,
    ) -> np.ndarray:
        """What transformers' forward returns first: logits (batch, len, vocab); for a model of
        kind "encoder" the last hidden state (batch, len, d_model) of a bare encoder
        (T5EncoderModel, BertModel), or its head's logits (BertForSequenceClassification:
        (batch, num_labels); token classification: (batch, len, num_labels); masked LM:
        (batch, len, vocab)).

        seq2seq: `attention_mask` (batch, src_len) marks the real source tokens (None: all);
        `decoder_input_ids` (batch, tgt_len) are the decoder's inputs (None: for BART and
        mBART the source shifted right, as transformers does; Marian needs them). The decoder
        is causal. LM (GPT-2): `attention_mask` hides padded keys (a left-padded batch),
        `position_ids` (batch, len) default to 0..len-1, as in transformers' forward. Encoder:
        `attention_mask` marks the real tokens (None: all); `position_ids` rows of the position
        table (None: the family's), `token_type_ids` (None: 0) where the model has them.
        """
        input_ids = _token_array("input_ids", input_ids)
        mask = _key_mask(attention_mask, input_ids)  # (batch, 1, 1, len)
        if self.kind == ENCODER:
            if decoder_input_ids is not None:
                raise ValueError(
                    "a bare encoder takes input_ids and attention_mask only (with token_type_ids "
                    "and position_ids where the model has them): no decoder_input_ids"
                )
            kwargs = self._encoder_inputs(input_ids, position_ids, token_type_ids)
            return self._encoder_forward(input_ids, mask, kwargs)
        if token_type_ids is not None:
            raise ValueError(f"token_type_ids is for encoder models; this is a {self.kind}")
        if self.kind == "lm":
            if decoder_input_ids is not None:
                raise ValueError("decoder_input_ids is for seq2seq models; GPT-2 takes input_ids")
            mask = jnp.logical_and(make_causal_mask(input_ids.shape[1]), mask)
            if position_ids is not None:
                position_ids = _token_array("position_ids", position_ids)
            out = self._apply(self.variables, input_ids, mask=mask, positions=position_ids)
            return np.asarray(out)
        if position_ids is not None:
            raise ValueError("position_ids is for GPT-2; seq2seq positions start at 0")
        if decoder_input_ids is None:
            decoder_input_ids = self.shift_right(input_ids)
        decoder_input_ids = _token_array("decoder_input_ids", decoder_input_ids)
        if decoder_input_ids.shape[0] != input_ids.shape[0]:
            raise ValueError(
                f"decoder_input_ids has batch {decoder_input_ids.shape[0]}, input_ids "
                f"{input_ids.shape[0]}"
            )
        out = self._apply(self.variables, input_ids, decoder_input_ids, src_mask=mask)
        return np.asarray(out)

    def _encoder_forward(self, input_ids, mask, kwargs: dict) -> np.ndarray:
        """The encoder on the inputs padded to their length bucket (hf.length_buckets: one
        compilation per bucket, not per length), the padded positions cut off again."""
        length = input_ids.shape[1]
        padded = bucket_length(length, self.config.max_len)
        if padded != length:
            input_ids = pad_columns(input_ids, padded, self.config.pad_id)
            mask = pad_columns(mask[:, 0, 0, :], padded, False)[:, None, None, :]
            kwargs = {name: pad_columns(value, padded, 0) for name, value in kwargs.items()}
        out = np.asarray(self._apply(self.variables, input_ids, src_mask=mask, **kwargs))
        return out[:, :length] if out.ndim == 3 else out  # a sequence head: (batch, labels)

    def _encoder_inputs(self, input_ids, position_ids, token_type_ids) -> dict[str, Any]:
        """The encoder's keyword inputs for transformers' position_ids (table rows, shifted by
        config.position_offset) and token_type_ids; ValueError for one the model lacks."""
        cfg, kwargs = self.config, {}
        if position_ids is not None:
            if cfg.positional == "none":
                raise ValueError("position_ids given to a model without absolute positions")
            rows = _token_array("position_ids", position_ids)
            kwargs["positions"] = rows - cfg.position_offset
        if token_type_ids is not None:
            if not cfg.type_vocab_size:
                raise ValueError(
                    f"token_type_ids given to a {self.model_type} model, which has none"
                )
            kwargs["token_types"] = _token_array("token_type_ids", token_type_ids)
        return kwargs

    def pooled_output(
        self, input_ids, attention_mask=None, position_ids=None, token_type_ids=None
    ) -> np.ndarray:
        """The pooler's output (batch, d_model) (transformers' `pooler_output`: dense + tanh on
        the first token's last hidden state), for a model that has a pooler (config.pooler)."""
        if self.kind != ENCODER or not self.config.pooler:
            raise ValueError(f"this {self.model_type} model has no pooler")
        input_ids = _token_array("input_ids", input_ids)
        mask = _key_mask(attention_mask, input_ids)
        kwargs = self._encoder_inputs(input_ids, position_ids, token_type_ids)
        _, pooled = self.module.apply(
            self.variables, input_ids, src_mask=mask, method="features", **kwargs
        )
        return np.asarray(pooled)

    def shift_right(self, input_ids: np.ndarray) -> np.ndarray:
        """The decoder inputs transformers makes when none are given: BART prepends
        decoder_start_token_id; mBART moves each row's last real token (its language code) to
        the front. Marian has no such default."""
        family = self.family
        if family.shift_right is None:
            raise ValueError(
                f"{self.model_type} needs decoder_input_ids (transformers builds none for it)"
            )
        return family.shift_right(input_ids, self.hf_config)

    def encoder_fn(self, dtype: str | None = None):
        """A function `encode(input_ids, attention_mask=None, params=None)` -> the encoder's
        last hidden state (batch, len, d_model), written in JAX: jit it, vmap it, call it
        inside your own model (a T5 text encoder inside a diffusion model). Works for a bare
        encoder (kind "encoder") and for the encoder of a seq2seq model.

        `attention_mask` (batch, len), nonzero on real tokens (None: every token is real, as
        in transformers); `params`: the model's params (default: the loaded ones, closed over;
        pass them to jit them as an argument rather than as constants, or to train them).
        `dtype` (e.g. "bfloat16") computes in that dtype on the stored weights (RMS norm and
        softmax statistics stay in float32); None: the dtype the model was loaded in.
        """
        if self.kind not in (ENCODER, SEQ2SEQ):
            raise ValueError(f"encoder_fn needs a model with an encoder; this is a {self.kind}")
        int8 = is_int8_products(self.module)
        if int8 and dtype not in (None, "float32"):
            raise ValueError(
                f"a model loaded with quantize='int8' computes in float32, not {dtype}"
            )
        config = self.config if dtype is None else self.config.replace(dtype=dtype)
        module = model_for(config, self.kind)
        if int8:  # its variables hold int8 matrices: the products that read them
            module = int8_products_model(module)
        method = None if self.kind == ENCODER else "encode"
        loaded = self.variables

        def encode(input_ids, attention_mask=None, params=None):
            input_ids = jnp.asarray(input_ids)
            if attention_mask is None:
                attention_mask = jnp.ones(input_ids.shape, bool)
            mask = (jnp.asarray(attention_mask) != 0)[:, None, None, :]
            variables = loaded if params is None else params
            if method is None:  # a bare encoder: its hidden states, before any head
                hidden, _ = module.apply(variables, input_ids, src_mask=mask, method="features")
                return hidden
            return module.apply(variables, input_ids, src_mask=mask, method=method)

        return encode

    def generate(self, input_ids, attention_mask=None, **kwargs):
        """Token ids as transformers' generate returns them (see flax_transformer.hf.generation)."""
        from flax_transformer.hf.generation import generate

        return generate(self, input_ids, attention_mask=attention_mask, **kwargs)


def _token_array(name: str, ids) -> np.ndarray:
    array = np.asarray(ids)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be (batch, length) integer token ids, got {array.shape}")
    return array.astype(np.int32)


def _key_mask(attention_mask, input_ids: np.ndarray) -> np.ndarray:
    if attention_mask is None:
        return np.ones((input_ids.shape[0], 1, 1, input_ids.shape[1]), bool)
    mask = np.asarray(attention_mask)
    if mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {mask.shape}, input_ids {input_ids.shape}: they must match"
        )
    return (mask != 0)[:, None, None, :]


QUANTIZE = (None, "int8")


def load(path: str | Path, dtype: str = "float32", quantize: str | None = None) -> HFModel:
    """A save_pretrained directory (marian, bart, mbart, gpt2, t5, mt5, umt5) as an HFModel
    whose weights are cast to and computed in `dtype` ("float64" needs JAX's x64 mode, e.g.
    parity checks; "bfloat16" keeps a bfloat16 checkpoint's bits), held as JAX arrays. The
    weights (model.safetensors or a sharded model.safetensors.index.json) are read, converted
    and cast one tensor at a time: no copy of the whole model in another dtype on the way.

    `quantize="int8"`: the Dense kernels and the embedding table held as int8 with one float32
    scale per output channel, every matrix product computed as dynamic int8 (activations
    quantised per row at run time, int8 x int8 -> int32; nn.int8_products). Faster on CPU,
    not token-identical to float32 (docs/hf.md gives the agreement). Every kind (seq2seq, LM,
    encoder with its pooler and head), in float32 only. None (default): the weights as stored."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {QUANTIZE}, got {quantize!r}")
    if quantize is not None and dtype != "float32":
        raise ValueError(f"quantize={quantize!r} computes in float32; got dtype {dtype!r}")
    if dtype == "float64" and jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
        raise ValueError(
            "dtype float64 needs JAX's 64-bit mode: jax.config.update('jax_enable_x64', True) "
            "or `with jax.enable_x64(True):`"
        )
    path = Path(path)
    checkpoint = read_hf_dir(path)
    where = str(path / "config.json")
    family = family_for(checkpoint.hf_config.get("model_type"), where)
    resolved = checkpoint.hf_config
    if family.resolve_config is not None:
        # As transformers reads it with these weights (T5: its defaults, the head's tying),
        # from the values as typed.
        resolved = family.resolved(check_hf_config(resolved, where), checkpoint.state)
    config, notes = hf_to_config(resolved, dtype, where=where)  # every problem
    # As transformers types it (512.0 read as 512): the weights' shapes come from it too.
    hf_config = check_hf_config(resolved, where)
    for note in notes:
        warnings.warn(f"{path}: {note}", stacklevel=2)
    kind = model_kind(hf_config)
    params = hf_state_to_params(
        checkpoint.state, hf_config, config, kind, str(checkpoint.weights_path)
    )
    module = model_for(config, kind)
    if quantize == "int8":
        module, params = int8_products_model(module), quantize_for_products(params)
    else:
        params = _on_device(params)
    return HFModel(
        module=module,
        variables=params,
        config=config,
        hf_config=hf_config,
        generation_config=checkpoint.generation_config,
        source=path,
    )


def _on_device(tree: dict) -> dict:
    """The numpy leaves of a nested dict as JAX arrays on the default device, one leaf at a
    time, each numpy array dropped as soon as it is placed (never two copies of the model)."""
    out = {}
    for name in list(tree):
        leaf = tree.pop(name)
        out[name] = _on_device(leaf) if isinstance(leaf, dict) else jax.device_put(leaf)
        del leaf
    return out


def save(
    model: HFModel, path: str | Path, max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE
) -> Path:
    """Write `model` as a save_pretrained directory: config.json, the weights in the model's
    parameter dtype (bit-exact: a bfloat16 model writes bfloat16), generation_config.json and
    the source directory's tokenizer. The weights are model.safetensors, or shards of at most
    `max_shard_size` bytes ("5GB", "200MB", or an int; transformers' save_pretrained default
    "50GB") with model.safetensors.index.json, as save_pretrained(max_shard_size=...) writes
    them. Each tensor is converted and written in turn: no second copy of the model."""
    if not isinstance(model, HFModel):
        raise TypeError(f"hf.save takes an HFModel (from hf.load), got {type(model).__name__}")
    if is_int8_products(model.module):
        raise ValueError("hf.save writes float weights; this model was loaded with quantize='int8'")
    parse_shard_size(max_shard_size)  # ValueError before anything is written
    model_type = model.hf_config.get("model_type")
    family_for(model_type, where="hf.save")  # UnsupportedConfigError (a ValueError) for others
    state = params_to_lazy_hf_state(model.variables, model.hf_config)
    hf_config = {**model.hf_config, "dtype": model.config.param_dtype}
    return write_hf_dir(
        path, hf_config, state, model.generation_config, model.source, max_shard_size
    )
