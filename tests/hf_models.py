"""Tiny random Hugging Face models (transformers' own PyTorch classes), saved with
save_pretrained, and a local tokenizer: nothing is downloaded.

Sizes keep d_model, d_ff and the vocabulary apart (a wrong transpose is a shape error).
"""

from __future__ import annotations

import contextlib
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

    settings = dict(
        SEQ2SEQ_SIZES,
        vocab_size=VOCAB,
        pad_token_id=MARIAN_PAD,
        decoder_start_token_id=MARIAN_PAD,
        eos_token_id=MARIAN_EOS,
        forced_eos_token_id=MARIAN_EOS,
        activation_function="swish",
        scale_embedding=True,
    )
    return MarianConfig(**{**settings, **changes})


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


# ----------------------------------------------------------------------------- T5 family
T5_VOCAB, T5_PAD, T5_EOS = 40, 0, 1  # T5's specials: <pad> 0, </s> 1, <unk> 2
# Heads of width 6: 3 x 6 = 18 != d_model 16 (as flan-t5-small's 6 x 64 != 512). 8 buckets up to
# distance 10: log-spaced from distance 2 (encoder) / 4 (decoder), all reached by 20 tokens.
T5_SIZES = dict(
    vocab_size=T5_VOCAB,
    d_model=16,
    d_kv=6,
    d_ff=24,
    num_layers=2,
    num_heads=3,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=10,
    dropout_rate=0.0,
    pad_token_id=T5_PAD,
    eos_token_id=T5_EOS,
    decoder_start_token_id=T5_PAD,
)
# name: (transformers class, config class, config changes, own lm_head)
T5_MODELS = {
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(num_decoder_layers=3), False),
    "t5_v1_1": (
        "T5ForConditionalGeneration",
        "T5Config",
        dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
        True,
    ),
    "mt5": ("MT5ForConditionalGeneration", "MT5Config", {}, True),
    "umt5": ("UMT5ForConditionalGeneration", "UMT5Config", {}, False),
    "t5_encoder": ("T5EncoderModel", "T5Config", dict(feed_forward_proj="gated-gelu"), False),
    "mt5_encoder": ("MT5EncoderModel", "MT5Config", {}, False),
    "umt5_encoder": ("UMT5EncoderModel", "UMT5Config", {}, False),
}


def t5_batch(rng: np.random.Generator, lengths, vocab: int = T5_VOCAB):
    """(input_ids, attention_mask) right-padded with T5's pad 0; ids in [3, vocab)."""
    return ragged_batch(rng, vocab + 4, lengths, low=3, pad=T5_PAD)


def build_t5(name: str, seed: int = 0, steps: int = 40):
    """A tiny transformers T5-family model trained `steps` Adam steps (so its outputs depend on
    the input and generation is not degenerate): seq2seq models learn to reverse their input
    (then </s>), encoders to predict the next input token through the shared table. The models
    with their own head (v1.1, mT5) get an lm_head separate from `shared`, as the released
    checkpoints have. Returned in eval mode, float32."""
    import transformers

    cls_name, config_name, changes, own_head = T5_MODELS[name]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**{**T5_SIZES, **changes})
    model = getattr(transformers, cls_name)(config)
    if own_head:
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend (35 s instead of 1 s)
    try:
        _train_t5(model, optimizer, rng, steps, encoder="Encoder" in cls_name)
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _train_t5(model, optimizer, rng, steps: int, encoder: bool) -> None:
    for _ in range(steps):
        ids, mask = t5_batch(rng, rng.integers(3, 12, size=16))
        inputs = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        if encoder:
            hidden = model(**inputs).last_hidden_state
            logits = hidden @ model.shared.weight.T
            target = np.where(np.roll(mask, -1, 1) == 1, np.roll(ids, -1, 1), -100)
            target[:, -1] = -100
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, T5_VOCAB), torch.from_numpy(target).reshape(-1)
            )
        else:
            labels = np.full((len(ids), ids.shape[1] + 1), -100)
            for row, n in enumerate(mask.sum(1)):
                labels[row, : n + 1] = [*ids[row, :n][::-1], T5_EOS]
            loss = model(**inputs, labels=torch.from_numpy(labels)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@contextlib.contextmanager
def t5_norms_in_input_dtype():
    """transformers' T5 / mT5 / UMT5 layer norms computing the variance in the input's dtype
    (they take it in float32 even in a float64 model, ~3e-7 relative noise in the logits): the
    float64 formula, which this project computes."""
    from transformers.models.mt5 import modeling_mt5
    from transformers.models.t5 import modeling_t5
    from transformers.models.umt5 import modeling_umt5

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    classes = (modeling_t5.T5LayerNorm, modeling_mt5.MT5LayerNorm, modeling_umt5.UMT5LayerNorm)
    saved = [cls.forward for cls in classes]
    for cls in classes:
        cls.forward = forward
    try:
        yield
    finally:
        for cls, original in zip(classes, saved, strict=True):
            cls.forward = original


def t5_tokenizer():
    """A word-level tokenizer with T5's specials (</s> appended to every text), as
    transformers' PreTrainedTokenizerFast: T5's own needs a sentencepiece model."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": T5_PAD, "</s>": T5_EOS, "<unk>": 2}
    vocab.update({word: i + 3 for i, word in enumerate(WORDS[: T5_VOCAB - 3])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", T5_EOS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def t5_outputs_pair(name: str, torch_model, hf_dir: Path, dtype: str, seed: int = 0):
    """(ours, transformers') logits, or last hidden states for a bare encoder, of a padded batch
    of 20, 7 and 13 tokens (decoder inputs of 9 from the pad id). float64: transformers' norms
    computing in float64 (t5_norms_in_input_dtype), both sides double; the caller enables x64."""
    from flax_transformer import hf

    rng = np.random.default_rng(seed)
    ids, mask = t5_batch(rng, (20, 7, 13))
    decoder = rng.integers(3, T5_VOCAB, size=(3, 9))
    decoder[:, 0] = T5_PAD
    encoder = "Encoder" in T5_MODELS[name][0]
    args = dict(input_ids=ids, attention_mask=mask)
    if not encoder:
        args["decoder_input_ids"] = decoder
    with contextlib.ExitStack() as stack:
        if dtype == "float64":
            stack.enter_context(t5_norms_in_input_dtype())
            reference = torch_model.double()
        else:
            reference = torch_model.float()
        model = hf.load(hf_dir, dtype=dtype)
        with torch.no_grad():
            out = reference(**{k: torch.from_numpy(v) for k, v in args.items()})
        ours = model.forward(**args)
    theirs = out.last_hidden_state if encoder else out.logits
    return ours, theirs.numpy()


# ----------------------------------------------------------------------------- BERT family
ENCODER_VOCAB = 67
ENCODER_LENGTHS = (12, 5, 9)  # a right-padded batch
# name: (transformers class, model_type); the configs are tiny (encoder_only_config).
ENCODER_MODELS = {
    "bert": ("BertModel", "bert"),
    "bert_sequence": ("BertForSequenceClassification", "bert"),
    "bert_token": ("BertForTokenClassification", "bert"),
    "bert_mlm": ("BertForMaskedLM", "bert"),
    "roberta": ("RobertaModel", "roberta"),
    "roberta_sequence": ("RobertaForSequenceClassification", "roberta"),
    "roberta_token": ("RobertaForTokenClassification", "roberta"),
    "roberta_mlm": ("RobertaForMaskedLM", "roberta"),
    "xlm_roberta": ("XLMRobertaModel", "xlm-roberta"),
    "xlm_roberta_sequence": ("XLMRobertaForSequenceClassification", "xlm-roberta"),
    "xlm_roberta_token": ("XLMRobertaForTokenClassification", "xlm-roberta"),
    "xlm_roberta_mlm": ("XLMRobertaForMaskedLM", "xlm-roberta"),
    "distilbert": ("DistilBertModel", "distilbert"),
    "distilbert_sequence": ("DistilBertForSequenceClassification", "distilbert"),
}


def encoder_only_config(model_type: str):
    """A tiny config of `model_type`: 2 layers, width 32, 4 heads, 3 labels; RoBERTa's pad id
    1 (its positions start after it), 3 token types."""
    import transformers

    labels = dict(id2label={0: "neg", 1: "neutral", 2: "pos"})
    if model_type == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=ENCODER_VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
            max_position_embeddings=40, seq_classif_dropout=0.1, **labels,
        )  # fmt: skip
    cls = {
        "bert": transformers.BertConfig,
        "roberta": transformers.RobertaConfig,
        "xlm-roberta": transformers.XLMRobertaConfig,
    }[model_type]
    pad = 0 if model_type == "bert" else 1
    return cls(
        vocab_size=ENCODER_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=40, type_vocab_size=3, pad_token_id=pad,
        layer_norm_eps=1e-12 if model_type == "bert" else 1e-5, **labels,
    )  # fmt: skip


def build_encoder_only(name: str, seed: int = 0):
    """A random transformers model of ENCODER_MODELS[name], in eval mode, every weight
    perturbed (the LayerNorms and biases too, which transformers initialises to 1 and 0)."""
    import transformers

    class_name, model_type = ENCODER_MODELS[name]
    torch.manual_seed(seed)
    model = getattr(transformers, class_name)(encoder_only_config(model_type)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return model


def encoder_only_batch(rng: np.random.Generator, pad: int, types: bool = True):
    """(input_ids, attention_mask, token_type_ids or None) of a right-padded batch."""
    ids, mask = ragged_batch(rng, ENCODER_VOCAB, ENCODER_LENGTHS, low=3, pad=pad)
    token_types = rng.integers(0, 3, size=ids.shape) * mask if types else None
    return ids, mask, token_types


def encoder_only_tokenizer(path: Path):
    """A WordPiece tokenizer over ENCODER_VOCAB made-up words, saved into `path` (a run
    directory needs one)."""
    import transformers

    words = ["[PAD]", "<pad>", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [f"w{i}" for i in range(ENCODER_VOCAB - len(words))]
    vocab = path / "vocab_source.txt"
    vocab.write_text("\n".join(words) + "\n")
    transformers.BertTokenizer(str(vocab)).save_pretrained(path)
    vocab.unlink()
