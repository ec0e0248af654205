"""transformers' generation settings, resolved as transformers 5.x resolves them.

Priority (transformers' `_prepare_generation_config`): the arguments of `generate` > the model's
generation_config.json > transformers' global defaults (GLOBAL_DEFAULTS below, copied from
`GenerationConfig._get_default_generation_params`). Without a generation_config.json the model's
config.json supplies the special tokens (transformers' `GenerationConfig.from_model_config`).
An argument given as None counts as not given.

Lengths (`_prepare_generated_length`), with `prompt_len` the length of the decoder's input when
generation starts (1 for a seq2seq model: the decoder start token; the padded prompt width for
a decoder-only model):
- `max_new_tokens` wins: max_length = prompt_len + max_new_tokens;
- else an explicit `max_length` (argument or generation_config.json) is the whole length,
  the decoder start token or the prompt included;
- else max_length = 20 + prompt_len, capped at max_position_embeddings.
- `min_new_tokens` likewise wins over `min_length`: min_length = prompt_len + min_new_tokens.
A prompt already as long as max_length is an error, as in transformers.

Special tokens (`_prepare_special_tokens`): eos_token_id may be a list; pad_token_id defaults to
the first EOS id; a seq2seq decoder starts with decoder_start_token_id, else bos_token_id.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

GLOBAL_DEFAULTS: dict[str, Any] = {
    "max_length": 20,
    "min_length": 0,
    "do_sample": False,
    "early_stopping": False,
    "num_beams": 1,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
    "length_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "num_return_sequences": 1,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
}
# What this implementation follows besides GLOBAL_DEFAULTS.
SUPPORTED = set(GLOBAL_DEFAULTS) | {
    "max_new_tokens",
    "min_new_tokens",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
}
# Settings that change nothing in the returned tokens when they have these values (transformers
# writes several of them into every generation_config.json).
ANY_VALUE = {"use_cache"}  # the output does not depend on it
HARMLESS = {
    "output_attentions": False,
    "output_hidden_states": False,
    "output_scores": False,
    "output_logits": False,
    "return_dict_in_generate": False,
    "typical_p": 1.0,
    "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0,
    "remove_invalid_values": False,
    "renormalize_logits": False,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "guidance_scale": None,
    "min_p": None,
    "top_h": None,
    "penalty_alpha": None,
    "low_memory": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "constraints": None,
    "force_words_ids": None,
    "max_time": None,
    "stop_strings": None,
    "token_healing": False,
    "cache_implementation": None,
    "prompt_lookup_num_tokens": None,
    "assistant_early_exit": None,
}
# Bookkeeping keys of generation_config.json, never settings.
METADATA = {"_from_model_config", "transformers_version"}
# config.json keys that transformers' from_model_config carries into a generation config.
MODEL_CONFIG_KEYS = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
)


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything one generate call needs, resolved and checked."""

    max_length: int  # the whole decoder sequence, prompt (or decoder start) included
    prompt_len: int
    min_length: int
    num_beams: int
    num_return_sequences: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    length_penalty: float
    early_stopping: bool | str  # True, False or "never"
    repetition_penalty: float
    no_repeat_ngram_size: int
    eos_ids: tuple[int, ...]  # () = no EOS: rows never finish early
    pad_id: int | None
    decoder_start_id: int | None
    bad_words_ids: tuple[tuple[int, ...], ...]  # EOS-only entries dropped, as transformers
    forced_bos_id: int | None
    forced_eos_ids: tuple[int, ...]

    @property
    def max_new_tokens(self) -> int:
        """Tokens the search may add per row: max_length - prompt_len."""
        return self.max_length - self.prompt_len


def _as_ids(value, name: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = list(value) if isinstance(value, list | tuple) else [value]
    for v in values:
        if not _is_int(v) or v < 0:
            raise ValueError(
                f"generate: {name} must be a token id or a list of them, got {value!r}"
            )
    return tuple(int(v) for v in values)


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def model_defaults(generation_config: dict, hf_config: dict) -> dict[str, Any]:
    """The model's own settings: generation_config.json, or else config.json's special tokens."""
    if generation_config:
        return {k: v for k, v in generation_config.items() if k not in METADATA}
    return {k: hf_config[k] for k in MODEL_CONFIG_KEYS if hf_config.get(k) is not None}


def unsupported(settings: dict[str, Any]) -> list[str]:
    """'name=value' for every setting this implementation does not follow."""
    bad = []
    for name, value in settings.items():
        if name in SUPPORTED or name in METADATA:
            continue
        if name in ANY_VALUE or (name in HARMLESS and value == HARMLESS[name]):
            continue
        bad.append(f"{name}={value!r}")
    return bad


def resolve(
    *,
    kwargs: dict[str, Any],
    generation_config: dict,
    hf_config: dict,
    is_seq2seq: bool,
    prompt_len: int,
    vocab_size: int,
) -> Options:
    """Options from the call's keyword arguments and the model's configuration."""
    given = {k: v for k, v in kwargs.items() if v is not None}
    own = model_defaults(generation_config, hf_config)
    bad = unsupported(given) + [f"{s} (generation_config.json)" for s in unsupported(own)]
    if bad:
        raise ValueError(
            "generate: unsupported generation option(s): "
            + ", ".join(bad)
            + f". Supported: {', '.join(sorted(SUPPORTED))}."
        )
    settings = {**GLOBAL_DEFAULTS, **own, **given}

    if "max_new_tokens" in settings:
        max_length = prompt_len + _positive(settings["max_new_tokens"], "max_new_tokens")
    elif "max_length" in given or "max_length" in own:
        max_length = _positive(settings["max_length"], "max_length")
    else:  # transformers' default: 20 new tokens, within the position table
        max_length = GLOBAL_DEFAULTS["max_length"] + prompt_len
        positions = hf_config.get("max_position_embeddings", hf_config.get("n_positions"))
        if positions is not None:
            max_length = min(max_length, positions)
    if prompt_len >= max_length:
        name = "decoder_input_ids" if is_seq2seq else "input_ids"
        raise ValueError(
            f"generate: input length of {name} is {prompt_len}, but max_length is {max_length}: "
            "nothing is left to generate (raise max_length or set max_new_tokens)"
        )
    if "min_new_tokens" in settings:
        min_length = prompt_len + _non_negative(settings["min_new_tokens"], "min_new_tokens")
    else:
        min_length = _non_negative(settings["min_length"], "min_length")

    eos_ids = _as_ids(settings.get("eos_token_id"), "eos_token_id")
    pad = settings.get("pad_token_id")
    pad_id = eos_ids[0] if pad is None and eos_ids else pad
    start = settings.get("decoder_start_token_id")
    start = settings.get("bos_token_id") if start is None else start
    if is_seq2seq and start is None:
        raise ValueError(
            "generate: a seq2seq model needs decoder_start_token_id or bos_token_id "
            "(argument, generation_config.json or config.json)"
        )
    for name, token in (("pad_token_id", pad_id), ("decoder_start_token_id", start)):
        if token is not None and not 0 <= token < vocab_size:
            raise ValueError(f"generate: {name} {token} is outside the vocabulary ({vocab_size})")

    num_beams = _positive(settings["num_beams"], "num_beams")
    num_return = _positive(settings["num_return_sequences"], "num_return_sequences")
    do_sample = bool(settings["do_sample"])
    if num_beams == 1 and not do_sample and num_return > 1:
        raise ValueError(
            "generate: greedy search (num_beams=1, do_sample=False) returns one sequence per "
            f"input; num_return_sequences={num_return} needs sampling or beam search"
        )
    if num_beams > 1 and num_return > num_beams:
        raise ValueError(
            f"generate: num_return_sequences ({num_return}) must be <= num_beams ({num_beams})"
        )
    if num_beams > 1 and do_sample:
        raise ValueError(
            "generate: beam sampling (num_beams > 1 with do_sample=True) is not supported"
        )
    early_stopping = settings["early_stopping"]
    if early_stopping not in (True, False, "never"):
        raise ValueError(
            f"generate: early_stopping must be True, False or 'never', got {early_stopping!r}"
        )

    bad_words = []
    for seq in settings.get("bad_words_ids") or ():
        ids = _as_ids(seq, "bad_words_ids")
        if not ids or not isinstance(seq, list | tuple):
            raise ValueError(
                f"generate: bad_words_ids must be a list of token id lists, got {seq!r}"
            )
        if any(t >= vocab_size for t in ids):
            raise ValueError(
                f"generate: bad_words_ids entry {list(ids)} is outside the vocabulary "
                f"({vocab_size})"
            )
        if len(ids) == 1 and ids[0] in eos_ids:
            continue  # transformers never bans a lone EOS
        bad_words.append(ids)

    forced_bos = settings.get("forced_bos_token_id")
    forced_eos = _as_ids(settings.get("forced_eos_token_id"), "forced_eos_token_id")
    for token in (*eos_ids, *forced_eos, *((forced_bos,) if forced_bos is not None else ())):
        if token >= vocab_size:
            raise ValueError(f"generate: token id {token} is outside the vocabulary ({vocab_size})")
    temperature = float(settings["temperature"])
    top_k, top_p = int(settings["top_k"]), float(settings["top_p"])
    if do_sample and not temperature > 0:
        raise ValueError(f"generate: temperature must be > 0 for sampling, got {temperature}")
    if do_sample and not 0 <= top_p <= 1:
        raise ValueError(f"generate: top_p must be in [0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"generate: top_k must be >= 0, got {top_k}")
    penalty = float(settings["repetition_penalty"])
    if not penalty > 0:
        raise ValueError(f"generate: repetition_penalty must be > 0, got {penalty}")
    return Options(
        max_length=max_length,
        prompt_len=prompt_len,
        min_length=min_length,
        num_beams=num_beams,
        num_return_sequences=num_return,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        length_penalty=float(settings["length_penalty"]),
        early_stopping=early_stopping,
        repetition_penalty=penalty,
        no_repeat_ngram_size=_non_negative(
            settings["no_repeat_ngram_size"], "no_repeat_ngram_size"
        ),
        eos_ids=eos_ids,
        pad_id=pad_id,
        decoder_start_id=start if is_seq2seq else None,
        bad_words_ids=tuple(bad_words),
        forced_bos_id=forced_bos,
        forced_eos_ids=forced_eos,
    )


def _positive(value, name: str) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"generate: {name} must be a positive int, got {value!r}")
    return int(value)


def _non_negative(value, name: str) -> int:
    if not _is_int(value) or value < 0:
        raise ValueError(f"generate: {name} must be a non-negative int, got {value!r}")
    return int(value)
