"""Tiny random Hugging Face models (transformers' own PyTorch classes), saved with
save_pretrained, and a local tokenizer: nothing is downloaded.

Sizes keep d_model, d_ff and the vocabulary apart (a wrong transpose is a shape error).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

VOCAB = 64  # Marian: </s> 0, <unk> 1, words 2..62, <pad> 63 (opus-mt puts pad last)
MARIAN_PAD, MARIAN_EOS = VOCAB - 1, 0
WORDS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [f"w{i}" for i in range(35)]

SEQ2SEQ_SIZES = dict(
    d_model=24,
    encoder_layers=2,
    decoder_layers=2,
    encoder_ffn_dim=40,
    decoder_ffn_dim=40,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    max_position_embeddings=48,
    dropout=0.0,
)


def marian_config(**changes):
    from transformers import MarianConfig

    return MarianConfig(
        **SEQ2SEQ_SIZES,
        vocab_size=VOCAB,
        pad_token_id=MARIAN_PAD,
        decoder_start_token_id=MARIAN_PAD,
        eos_token_id=MARIAN_EOS,
        forced_eos_token_id=MARIAN_EOS,
        activation_function="swish",
        scale_embedding=True,
        **changes,
    )


def bart_config(**changes):
    from transformers import BartConfig

    return BartConfig(**SEQ2SEQ_SIZES, vocab_size=VOCAB - 4, activation_function="gelu", **changes)


def mbart_config(**changes):
    from transformers import MBartConfig

    return MBartConfig(**SEQ2SEQ_SIZES, vocab_size=VOCAB - 6, scale_embedding=True, **changes)


def gpt2_config(**changes):
    from transformers import GPT2Config

    return GPT2Config(
        n_embd=24,
        n_layer=2,
        n_head=4,
        n_inner=40,
        n_positions=48,
        vocab_size=VOCAB - 2,
        bos_token_id=VOCAB - 3,
        eos_token_id=VOCAB - 3,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **changes,
    )


def build(model_type: str, seed: int = 0, **changes):
    """A random transformers model of `model_type`, in eval mode, with a nonzero
    final_logits_bias where the family has one (a zero bias could hide a missing one)."""
    from transformers import (
        BartForConditionalGeneration,
        GPT2LMHeadModel,
        MarianMTModel,
        MBartForConditionalGeneration,
    )

    classes = {
        "marian": (MarianMTModel, marian_config),
        "bart": (BartForConditionalGeneration, bart_config),
        "mbart": (MBartForConditionalGeneration, mbart_config),
        "gpt2": (GPT2LMHeadModel, gpt2_config),
    }
    cls, config = classes[model_type]
    torch.manual_seed(seed)
    model = cls(config(**changes)).eval()
    if hasattr(model, "final_logits_bias"):
        model.final_logits_bias.normal_(0.0, 0.5)
    return model


def save(model, path: Path, tokenizer: bool = False) -> Path:
    model.save_pretrained(path)
    if tokenizer:
        marian_tokenizer().save_pretrained(path)
    return path


def marian_tokenizer():
    """A word-level tokenizer with Marian's specials (eos appended to every text), wrapped as
    transformers' PreTrainedTokenizerFast: MarianTokenizer itself needs sentencepiece files."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"</s>": MARIAN_EOS, "<unk>": 1, "<pad>": MARIAN_PAD}
    vocab.update({word: i + 2 for i, word in enumerate(WORDS[: VOCAB - 3])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", MARIAN_EOS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def ragged_batch(rng: np.random.Generator, vocab: int, lengths, low: int = 3, pad: int = 0):
    """(input_ids, attention_mask) right-padded with `pad`; ids in [low, vocab - 4)."""
    ids = rng.integers(low, vocab - 4, size=(len(lengths), max(lengths)))
    mask = (np.arange(max(lengths))[None] < np.asarray(lengths)[:, None]).astype(np.int64)
    return np.where(mask == 1, ids, pad), mask


def logits_pair(model_type: str, torch_model, hf_dir: Path, dtype: str, seed: int = 0):
    """(Flax logits, transformers' logits) on the real positions of a ragged batch: right-
    padded sources for seq2seq, a left-padded batch with attention_mask for GPT-2. float64
    runs both sides in double (the caller enables JAX's x64 mode)."""
    from flax_transformer import hf

    rng = np.random.default_rng(seed)
    model = hf.load(hf_dir, dtype=dtype)
    reference = torch_model.double() if dtype == "float64" else torch_model.float()
    pad = model.config.pad_id
    if model_type == "gpt2":
        ids, mask = ragged_batch(rng, model.config.tgt_vocab_size, (9, 5, 7), pad=pad)
        ids, mask = ids[:, ::-1].copy(), mask[:, ::-1].copy()  # left padding
        args, valid = dict(input_ids=ids, attention_mask=mask), mask.astype(bool)
    else:
        ids, mask = ragged_batch(rng, model.config.src_vocab_size, (9, 5, 7), pad=pad)
        decoder = rng.integers(3, model.config.tgt_vocab_size - 4, size=(3, 6))
        start = model.config.decoder_start_id  # mBART has none: its language codes start
        decoder[:, 0] = model.config.eos_id if start is None else start
        args = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder)
        valid = np.ones(decoder.shape, bool)
    flax_logits = model.forward(**args)
    with torch.no_grad():
        torch_args = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in args.items()}
        hf_logits = reference(**torch_args).logits.numpy()
    return flax_logits[valid], hf_logits[valid]
