"""`generate` for an imported Hugging Face model, token for token as transformers' `generate`.

    tokens = generate(hf_model, input_ids, attention_mask, num_beams=4, max_new_tokens=64)

Arguments and defaults are transformers' (generation_options.py: generation_config.json and
config.json honoured as transformers honours them); greedy search, sampling (do_sample with
temperature / top_k / top_p; JAX's random numbers, so not the same draws as torch) and beam
search (hf/beam_selector.py), each a selector of the package's one decoding engine
(flax_transformer.decoding.engine) with transformers' logits processors plugged in as a rule
(generation_processors.py). The result has transformers' layout, numpy int64:
- seq2seq (marian, bart): (B * num_return_sequences, 1 + new) rows starting with the decoder
  start token;
- decoder-only (gpt2): (B * num_return_sequences, P + new), the (left-padded) prompt as given,
  then the continuation;
finished rows filled with pad_token_id, the width that of the longest row.

One jitted function runs the whole search (the engine's lax.while_loop, KV cache, the encoder
once, the cross-attention keys/values projected once). Compile-time constants: the model, the input
shapes, the number of new tokens, num_beams, num_return_sequences and which processors are on;
every number they use (length_penalty, temperature, penalties, token ids in masks) is traced,
so changing it does not recompile.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.decoding.cache import make_stepper
from flax_transformer.decoding.engine import run_search
from flax_transformer.decoding.inputs import Source
from flax_transformer.decoding.longrope import switching_stepper, tables
from flax_transformer.decoding.rules import ChooseGreedy
from flax_transformer.decoding.token_search import TokenSelector
from flax_transformer.hf import longrope_generation
from flax_transformer.hf.beam_selector import HFBeam
from flax_transformer.hf.generation_options import Options, resolve
from flax_transformer.hf.generation_processors import HFProcessors, plan_and_knobs, sampling_rule
from flax_transformer.hf.generation_rows import Rows
from flax_transformer.nn.f32_products import for_generation
from flax_transformer.nn.token_ids import check_token_ids


@dataclasses.dataclass(frozen=True)
class _Search:
    """What is static about one search besides the model (jit static argument)."""

    plan: object  # ProcessorPlan
    beams: int  # 1: greedy / sampling
    sample: bool
    n_eos: int
    n_new: int
    prefix_len: int  # tokens prefilled in one call: the shortest prompt
    recompute: bool | None = None  # longrope's switch-over (longrope_generation.py): None: none


@functools.partial(jax.jit, static_argnames=("model", "search"))
def _run(
    model, variables, rows: Rows, source: Source | None, knobs, rng, search: _Search, long_from
):
    cache_len = rows.tokens.shape[1] + search.n_new - 1  # the last token is not fed
    if search.recompute is None:
        stepper = make_stepper(model, variables, source, cache_len, True)
    else:
        stepper = switching_stepper(model, variables, cache_len, long_from, search.recompute)
    if search.beams > 1:
        selector = HFBeam(
            rows,
            HFProcessors(search.plan, knobs),
            beams=search.beams,
            n_eos=search.n_eos,
            n_new=search.n_new,
        )
    else:
        selector = token_selector(
            rows, search.plan, knobs, rng, n_new=search.n_new, sample=search.sample,
            has_eos=search.n_eos > 0,
        )  # fmt: skip
    return run_search(stepper, rows, selector, prefix_len=search.prefix_len)


def token_selector(rows: Rows, plan, knobs, rng, *, n_new: int, sample: bool, has_eos: bool):
    """Greedy search or sampling with transformers' rules: the engine's TokenSelector writing
    transformers' layout (rows.seq, the prompt left-padded); result (seq (B, max_length),
    steps (B,)), transformers' output being seq[:, :P + max(steps)]."""
    return TokenSelector(
        prompts=rows,
        buffer=rows.seq,
        offset=rows.pads,  # transformers' layout: the prompt left-padded
        choose=sampling_rule(plan, knobs) if sample else ChooseGreedy(),
        eos=knobs.eos_tokens,
        pad=knobs.pad_id,
        n_new=n_new,
        rng=rng,
        processors=HFProcessors(plan, knobs),
        has_eos=has_eos,
    )


def generate(hf_model, input_ids, attention_mask=None, *, seed=None, rng=None, **kwargs):
    """transformers' `generate(input_ids, attention_mask, **kwargs)` for an HFModel.

    seed (int) or rng (a jax.random.key) seeds sampling (default seed 0). Other keyword
    arguments: transformers' generation options (generation_options.py); an option this
    implementation does not follow is an error naming it.
    """
    model, config = hf_model.module, hf_model.config
    if hf_model.kind not in ("seq2seq", "lm"):
        raise ValueError(
            f"generate: a {hf_model.kind} model has no decoder to generate with (a bare "
            "encoder: use forward or encoder_fn)"
        )
    is_seq2seq = hf_model.kind == "seq2seq"
    ids = _token_array(input_ids, "input_ids")
    mask = None if attention_mask is None else _token_array(attention_mask, "attention_mask")
    if mask is not None and mask.shape != ids.shape:
        raise ValueError(
            f"generate: attention_mask has shape {mask.shape}, input_ids {ids.shape}: "
            "they must match"
        )
    vocab = config.tgt_vocab_size
    check_token_ids("generate: input_ids", ids, config.src_vocab_size)
    opts = resolve(
        kwargs=kwargs,
        generation_config=hf_model.generation_config or {},
        hf_config=hf_model.hf_config or {},
        is_seq2seq=is_seq2seq,
        prompt_len=1 if is_seq2seq else ids.shape[1],
        vocab_size=vocab,
    )
    expand = max(opts.num_beams, opts.num_return_sequences) if opts.num_beams == 1 else 1
    if expand > 1:  # sampling several sequences per input: transformers repeats the rows
        ids = np.repeat(ids, expand, axis=0)
        mask = None if mask is None else np.repeat(mask, expand, axis=0)
    if is_seq2seq:
        rows, source = _seq2seq_rows(ids, mask, opts, config.max_len)
    else:
        rows, source = _lm_rows(ids, mask, opts, config.max_len), None
    rope, long_from, recompute = ("plain", None, False)
    if not is_seq2seq:  # Phi-3's longrope switch-over (a decoder-only rule)
        rope, long_from, recompute = longrope_generation.plan(
            config, np.asarray(rows.pads), ids.shape[1], opts.max_length
        )
    if opts.num_beams > 1:  # transformers fills beam outputs with `pad or eos[0]`, else -1
        fill = (opts.pad_id or opts.eos_ids[0]) if opts.eos_ids else -1
        rows = rows.replace(
            seq=np.where(np.arange(opts.max_length) < opts.prompt_len, rows.seq, fill)
        )
    plan, knobs = plan_and_knobs(opts, vocab)
    search = _Search(
        plan=plan,
        beams=opts.num_beams,
        sample=opts.do_sample,
        n_eos=len(opts.eos_ids),
        n_new=opts.max_new_tokens,
        prefix_len=int(rows.lengths.min()),
        recompute=recompute if rope == "switch" else None,
    )
    if rng is None:
        rng = jax.random.key(0 if seed is None else int(seed))
    rows = jax.tree.map(jnp.asarray, rows)
    model, variables = _for_generation(hf_model)
    if rope == "long":  # the prompt passes original_max_position_embeddings already
        model = tables(model)[1]
    seq, lengths = _run(model, variables, rows, source, knobs, rng, search, long_from)
    seq, lengths = np.asarray(seq), np.asarray(lengths)
    if opts.num_beams > 1:
        nrs = opts.num_return_sequences
        seq, lengths = seq[:, :nrs].reshape(-1, seq.shape[-1]), lengths[:, :nrs].reshape(-1)
    return seq[:, : opts.prompt_len + int(lengths.max())].astype(np.int64)


# HFModel -> (the identity of its weight arrays, the model and weights the search runs, the
# arrays). Numpy weights (as hf.load gives them) would otherwise be copied to the device (and
# packed) by every call: ~300 MB for opus-mt. A replaced array (or variables dict) is noticed
# and the weights are copied again.
_DEVICE_VARIABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _for_generation(hf_model):
    """(model, variables on the device) for the search. A float32 Transformer / TransformerLM
    computes its products in kernels.f32_packed where that runs (FLAX_TRANSFORMER_F32_KERNEL, read
    when the model first generates): its twin from nn.f32_products, on weights packed once."""
    leaves = jax.tree.leaves(hf_model.variables)
    identity = tuple(map(id, leaves))
    cached = _DEVICE_VARIABLES.get(hf_model)
    if cached is None or cached[0] != identity:
        model, variables = for_generation(hf_model.module, hf_model.variables, hf_model.config)
        cached = (identity, model, jax.device_put(variables), leaves)  # leaves: keep ids alive
        _DEVICE_VARIABLES[hf_model] = cached
    return cached[1], cached[2]


def _token_array(value, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"generate: {name} must be (batch, length) integers, got shape {array.shape} "
            f"dtype {array.dtype}"
        )
    return array


def _seq2seq_rows(ids, mask, opts: Options, max_len: int):
    """Rows of [decoder start] and the encoder's Source. Without an attention_mask the encoder
    attends to every source token, padding included, as in transformers."""
    batch, src_len = ids.shape
    if src_len > max_len:
        raise ValueError(f"generate: input_ids has {src_len} tokens, more than max_len {max_len}")
    if opts.max_length - 1 > max_len:
        raise ValueError(
            f"generate: max_length {opts.max_length} exceeds the decoder's positions "
            f"({max_len} + 1)"
        )
    key_mask = np.ones(ids.shape, bool) if mask is None else mask.astype(bool)
    start = np.full((batch, 1), opts.decoder_start_id, np.int32)
    seq = np.full((batch, opts.max_length), _fill(opts), np.int32)
    seq[:, 0] = opts.decoder_start_id
    rows = Rows(start, np.ones(batch, np.int32), np.zeros(batch, np.int32), seq)
    source = Source(jnp.asarray(ids, jnp.int32), jnp.asarray(key_mask[:, None, None, :]))
    return rows, source


def _lm_rows(ids, mask, opts: Options, max_len: int) -> Rows:
    """Rows of a decoder-only model from left-padded prompts (transformers' layout)."""
    batch, width = ids.shape
    if mask is None:  # transformers: from pad_token_id when it is in the input and is no EOS
        pad = opts.pad_id
        infer = pad is not None and (ids == pad).any() and pad not in opts.eos_ids
        mask = (ids != pad) if infer else np.ones(ids.shape, bool)
    mask = mask.astype(bool)
    lengths = mask.sum(axis=1)
    left_padded = mask == (np.arange(width)[None, :] >= (width - lengths)[:, None])
    if not left_padded.all() or lengths.min() < 1:
        bad = int(np.flatnonzero(~left_padded.all(axis=1) | (lengths < 1))[0])
        raise ValueError(
            f"generate: attention_mask row {bad} is {mask[bad].astype(int).tolist()}: a "
            "decoder-only model needs left-padded prompts (zeros first, then at least one 1), "
            "as transformers expects them"
        )
    if opts.max_length - 1 > max_len:
        raise ValueError(
            f"generate: max_length {opts.max_length} exceeds the model's positions ({max_len} + 1)"
        )
    pads = (width - lengths).astype(np.int32)
    tokens = np.zeros((batch, width), np.int32)
    for row in range(batch):
        tokens[row, : lengths[row]] = ids[row, pads[row] :]
    seq = np.full((batch, opts.max_length), _fill(opts), np.int32)
    seq[:, :width] = ids
    return Rows(tokens, lengths.astype(np.int32), pads, seq)


def _fill(opts: Options) -> int:
    """What greedy search leaves after a finished row's EOS: pad_token_id (0 when unset: rows
    without an EOS id never finish, so nothing is filled)."""
    return 0 if opts.pad_id is None else opts.pad_id
