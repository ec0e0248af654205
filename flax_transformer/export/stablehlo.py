"""Serialized StableHLO (jax.export) of a run: the forward pass and the whole cached greedy
decoder, weights baked in, symbolic batch and lengths.

    forward.stablehlo  seq2seq: call(src (B, S), tgt_in (B, T)) -> logits (B, T, V)
                       LM:      call(tokens (B, T)) -> logits (B, T, V)
    greedy.stablehlo   seq2seq: call(src (B, S)) -> new tokens (B, max_new_tokens)
                       LM:      call(prompts (B, P)) -> the tokens after each prompt
    manifest.json      shapes, dtypes, constraints, token ids; tokenizer.json

Inputs are int32 token ids padded with pad_id (an LM's prompts right-padded, each starting with
BOS); logits have the model's dtype (float32 for a float32 run); tokens are int32, EOS kept and
pad after it, exactly what `decoding.generate(..., Greedy())` returns. Lengths are bounded by
max_len (the exported code checks the constraints when called): S, T <= max_len, and for an LM
P + max_new_tokens - 1 <= max_len. Loading needs only jax: `jax.export.deserialize(data).call`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from flax_transformer.decoding.api import search
from flax_transformer.decoding.inputs import Prompts, Source
from flax_transformer.decoding.strategies import Greedy
from flax_transformer.export.int8 import int8_model, quantize_variables
from flax_transformer.export.output import ExportError, tensor_spec, write_manifest
from flax_transformer.files.atomic_io import atomic_write_bytes
from flax_transformer.nn.attention import make_padding_mask
from flax_transformer.nn.kinds import is_lm
from flax_transformer.spec.kinds import LM

FORWARD, GREEDY = "forward.stablehlo", "greedy.stablehlo"


def default_max_new_tokens(config, kind: str) -> int:
    """max_len for a seq2seq run (the generate CLI's default); half of it for an LM, so that
    prompts of up to max_len / 2 + 1 tokens fit."""
    return config.max_len if kind != LM else max(config.max_len // 2, 1)


def check_max_new_tokens(config, kind: str, max_new_tokens: int) -> None:
    """ExportError unless 1 <= `max_new_tokens` <= config.max_len."""
    if not 1 <= max_new_tokens <= config.max_len:
        raise ExportError(
            f"--max-new-tokens {max_new_tokens} must be 1..max_len ({config.max_len})"
        )


def symbols(names: str, constraints: list[str]):
    """Symbolic dimensions for one exported function (each function has its own scope)."""
    return jax.export.symbolic_shape(names, constraints=constraints)


def _int32(*shape) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def forward_function(model, variables):
    """The jitted forward pass with the weights closed over (they become constants)."""
    if is_lm(model):
        return jax.jit(lambda tokens: model.apply(variables, tokens))
    return jax.jit(lambda src, tgt_in: model.apply(variables, src, tgt_in))


def greedy_function(model, variables, *, max_new_tokens: int, bos_id: int, eos_id: int):
    """The jitted greedy decoder of `decoding.generate`, built for traced inputs: the batch and
    the lengths may be symbolic. An LM's prompt lengths are counted in the graph (non-pad
    tokens) and only the BOS is prefilled: prompts of every length share one program."""
    pad_id = model.config.pad_id
    kw = dict(max_new_tokens=max_new_tokens, eos_id=eos_id, prefix_len=1)

    if is_lm(model):

        def greedy_lm(prompts):
            lengths = jnp.sum(prompts != pad_id, axis=1).astype(jnp.int32)
            return search(model, variables, Prompts(prompts, lengths), None, Greedy(), **kw)

        return jax.jit(greedy_lm)

    def greedy_seq2seq(src):
        batch = src.shape[0]
        prompts = Prompts(jnp.full((batch, 1), bos_id, jnp.int32), jnp.ones((batch,), jnp.int32))
        source = Source(src, make_padding_mask(src, pad_id))
        return search(model, variables, prompts, source, Greedy(), **kw)

    return jax.jit(greedy_seq2seq)


def export_stablehlo(
    run, directory: Path, *, max_new_tokens: int, int8: bool = False, platforms=("cpu",)
) -> dict:
    """Writes forward.stablehlo, greedy.stablehlo and manifest.json into `directory`.

    run: config, model_kind, params ({"params": ...}), tokenizer, model (training.load_run's
    RunArtifacts). int8: the weights are baked in as int8 matrices with per-channel scales
    (export.int8), dequantised inside the program."""
    cfg, kind = run.config, run.model_kind
    check_max_new_tokens(cfg, kind, max_new_tokens)
    model, variables = run.model, run.params
    if int8:
        model, variables = int8_model(model), quantize_variables(variables)
    bos, eos = run.tokenizer.bos_id, run.tokenizer.eos_id
    L, V, dtype = cfg.max_len, cfg.tgt_vocab_size, cfg.dtype
    export = lambda fn, *args: jax.export.export(fn, platforms=platforms)(*args)  # noqa: E731

    if kind == LM:
        prompt_max = L - max_new_tokens + 1
        constraints = {"forward": [f"length <= {L}"], "greedy": [f"prompt_len <= {prompt_max}"]}
        b, t = symbols("batch, length", constraints["forward"])
        forward = export(forward_function(model, variables), _int32(b, t))
        forward_io = ([tensor_spec("tokens", "int32", ["batch", "length"])], ["batch", "length"])
        b, p = symbols("batch, prompt_len", constraints["greedy"])
        greedy_in = [tensor_spec("prompts", "int32", ["batch", "prompt_len"])]
    else:
        constraints = {
            "forward": [f"src_len <= {L}", f"tgt_len <= {L}"],
            "greedy": [f"src_len <= {L}"],
        }
        b, s, t = symbols("batch, src_len, tgt_len", constraints["forward"])
        forward = export(forward_function(model, variables), _int32(b, s), _int32(b, t))
        forward_io = (
            [
                tensor_spec("src", "int32", ["batch", "src_len"]),
                tensor_spec("tgt_in", "int32", ["batch", "tgt_len"]),
            ],
            ["batch", "tgt_len"],
        )
        b, p = symbols("batch, src_len", constraints["greedy"])
        greedy_in = [tensor_spec("src", "int32", ["batch", "src_len"])]
    decoder = greedy_function(
        model, variables, max_new_tokens=max_new_tokens, bos_id=bos, eos_id=eos
    )
    greedy = export(decoder, _int32(b, p))

    atomic_write_bytes(directory / FORWARD, forward.serialize())
    atomic_write_bytes(directory / GREEDY, greedy.serialize())
    files = {
        "forward": {
            "file": FORWARD,
            "inputs": forward_io[0],
            "outputs": [tensor_spec("logits", dtype, [*forward_io[1], V])],
            "constraints": constraints["forward"],
        },
        "greedy": {
            "file": GREEDY,
            "inputs": greedy_in,
            "outputs": [tensor_spec("tokens", "int32", ["batch", max_new_tokens])],
            "constraints": constraints["greedy"],
            "max_new_tokens": max_new_tokens,
        },
    }
    return write_manifest(directory, run, "stablehlo", files, int8=int8, platforms=list(platforms))
