"""Fine-tuning data for decoder LLMs (data/chat.py, data/finetune.py): the assistant mask as
transformers' return_assistant_tokens_mask gives it (templates with {% generation %}) and as
prefix rendering finds it (the real templates, without markers), bad chat lines as one-line
errors naming the file and line, and the loss on the replies only (training/steps.py), in
float64 against a hand computation, packed and not."""

from __future__ import annotations

import functools
import json

import jax
import numpy as np
import pytest

from flax_transformer.data.chat import chat_messages, encode_chats, read_chat_jsonl
from flax_transformer.data.finetune import finetune_format, read_finetune_dataset
from flax_transformer.data.pipeline import BatchLoader, DataError, make_batch
from flax_transformer.hf.chat_template import ChatTemplate
from flax_transformer.hf.tokenizer import HFTokenizer

from . import hf_chat

transformers = pytest.importorskip("transformers")

CHATS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Tell me a short story."},
        {"role": "assistant", "content": " A cat sits on a mat in the sun. "},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "I am fine, thank you <|im_end|> for asking."},
    ],
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """{template name: (transformers tokenizer, HFTokenizer)} over one trained BPE."""
    out = {}
    for name, family, source in (
        ("llama3", "llama", hf_chat.LLAMA3_TEMPLATE),
        ("llama3_marked", "llama", hf_chat.LLAMA3_MARKED),
        ("qwen25", "qwen", hf_chat.QWEN25_TEMPLATE),
        ("chatml_marked", "qwen", hf_chat.CHATML_MARKED),
    ):
        path = hf_chat.tokenizer_directory(tmp_path_factory.mktemp(name), family, source)
        theirs = transformers.AutoTokenizer.from_pretrained(path)
        ids = dict(pad_id=0, bos_id=0, eos_id=0, vocab_size=hf_chat.VOCAB)
        out[name] = (theirs, HFTokenizer(theirs, **ids, directory=path))
    return out


def transformers_mask(tokenizer, messages):
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


@pytest.mark.parametrize("name", ["llama3_marked", "chatml_marked"])
def test_generation_markers_give_transformers_mask(tokenizers, name):
    theirs, ours = tokenizers[name]
    template = ChatTemplate.of_tokenizer(ours)
    assert template.has_generation_markers
    for messages in CHATS:
        ids, mask = template.ids_and_assistant_mask(ours, messages)
        assert (ids, mask) == transformers_mask(theirs, messages)
        assert 0 < sum(mask) < len(mask)


@pytest.mark.parametrize(
    ("name", "marked"), [("llama3", "llama3_marked"), ("qwen25", "chatml_marked")]
)
def test_prefix_rendering_finds_what_the_markers_mark(tokenizers, name, marked):
    """The real templates have no markers: prefix rendering must find the spans that the
    marked twin of each template marks (the reply and its end of turn)."""
    theirs, ours = tokenizers[name]
    template = ChatTemplate.of_tokenizer(ours)
    assert not template.has_generation_markers
    for messages in CHATS:
        ids, mask = template.ids_and_assistant_mask(ours, messages)
        marked_ids, marked_mask = transformers_mask(tokenizers[marked][0], messages)
        assert ids == marked_ids == theirs.apply_chat_template(messages, return_dict=False)
        assert mask == marked_mask
        reply = theirs.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert messages[-1]["content"].strip() in reply


def test_encode_chats_shifts_ids_and_weights(tokenizers):
    _, ours = tokenizers["qwen25"]
    template = ChatTemplate.of_tokenizer(ours)
    chats = [(m, f"f.jsonl:{i}") for i, m in enumerate(CHATS, start=1)]
    dataset = encode_chats(chats, ours, template, max_len=200)
    for (messages, _), tgt_in, tgt_out, weights in zip(
        chats, dataset.tgt_in, dataset.tgt_out, dataset.tgt_weights, strict=True
    ):
        ids, mask = template.ids_and_assistant_mask(ours, messages)
        assert tgt_in.tolist() == ids[:-1] and tgt_out.tolist() == ids[1:]
        assert weights.dtype == np.float32 and weights.tolist() == mask[1:]
    shortest = min(len(t) for t in dataset.tgt_in)
    with pytest.warns(UserWarning, match="1 pair"):
        skipped = encode_chats(chats, ours, template, max_len=shortest)
    assert len(skipped) == 1
    with pytest.warns(UserWarning, match="2 pair"):
        cut = encode_chats(chats, ours, template, max_len=shortest - 5, on_long="truncate")
    assert [len(t) for t in cut.tgt_in] == [shortest - 5] * 2
    with pytest.raises(DataError, match="^f.jsonl:1: a conversation of"):
        encode_chats(chats, ours, template, max_len=shortest, on_long="error")


MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)
BAD_LINES = {
    "not json": "not valid JSON",
    json.dumps({"text": "a"}): 'a non-empty "messages" list',
    json.dumps({"messages": ["hi"]}): "message 1 is not an object",
    json.dumps({"messages": [{"content": "hi"}]}): 'message 1 has no string "role"',
    json.dumps({"messages": [{"role": "user", "content": None}]}): 'no string "content"',
    json.dumps({"messages": [{"role": "robot", "content": "x"}]}): "unknown role 'robot'",
    json.dumps({"messages": [{"role": "user", "content": "x"}]}): "no assistant reply",
}


def test_bad_chat_lines_name_the_file_and_line(tmp_path, tokenizers):
    path = tmp_path / "chat.jsonl"
    good = json.dumps({"messages": CHATS[1]})
    for line, problem in BAD_LINES.items():
        path.write_text(f"{good}\n\n{line}\n")
        with pytest.raises(DataError) as err:
            read_chat_jsonl(path)
        assert str(err.value).startswith(f"chat JSONL file {path} line 3: "), err.value
        assert problem in str(err.value) and "\n" not in str(err.value)
    assert chat_messages(path, 1, "  ") is None
    # A template that raises on a conversation: its file and line, and the template's words.
    _, ours = tokenizers["llama3"]
    template = ChatTemplate(MISTRAL, ours.special_tokens, "tok/chat_template.jinja")
    path.write_text(f"{good}\n")
    with pytest.raises(DataError) as err:
        read_finetune_dataset(path, ours, 200, template=template)
    message = str(err.value)
    assert message.startswith(f"{path}:1: tok/chat_template.jinja: the chat template failed: ")
    assert message.endswith("Only user and assistant roles are supported!")


def test_text_and_jsonl_documents(tmp_path, tokenizers):
    _, ours = tokenizers["llama3"]
    ours = HFTokenizer(ours._tok, pad_id=7, bos_id=5, eos_id=7, vocab_size=hf_chat.VOCAB)
    (tmp_path / "a.txt").write_text("Hello there\n\nThe capital of France\n")
    lines = [json.dumps({"text": t}) for t in ("Hello there", "The capital of France")]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.jsonl").write_text(json.dumps({"messages": CHATS[1]}) + "\n")
    assert [finetune_format(tmp_path / n) for n in ("a.txt", "a.jsonl", "c.jsonl")] == [
        "text", "jsonl", "chat"
    ]  # fmt: skip
    for name in ("a.txt", "a.jsonl"):
        dataset = read_finetune_dataset(tmp_path / name, ours, max_len=8)
        ids = [5] + ours.encode("Hello there") + [7]
        rows = [ids[s : s + 9] for s in range(0, len(ids) - 1, 8)]
        assert [t.tolist() for t in dataset.tgt_in[: len(rows)]] == [r[:-1] for r in rows]
        assert [t.tolist() for t in dataset.tgt_out[: len(rows)]] == [r[1:] for r in rows]
        # every target weighs 1, the EOS too (here eos_id == pad_id, as in Llama's files)
        for weights, targets in zip(dataset.tgt_weights, dataset.tgt_out, strict=True):
            assert weights.tolist() == [1.0] * len(targets)


# ----------------------------------------------------------------------------- the loss
def test_weighted_loss_equals_the_hand_computation_in_float64():
    from flax_transformer.training.steps import loss_from_logits

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)) * 3
    targets = rng.integers(1, 7, size=(2, 5))
    targets[1, 3:] = 0  # padding
    weights = np.array([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]], np.float32)
    with jax.enable_x64(True):
        loss, aux = loss_from_logits(logits, targets, 0, weights=weights)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = [(b, t) for b in range(2) for t in range(5) if weights[b, t]]
    expected = -sum(log_probs[b, t, targets[b, t]] for b, t in picked) / len(picked)
    assert abs(float(loss) - expected) <= 1e-12 * abs(expected)
    assert float(aux["token_count"]) == len(picked)
    right = sum(int(logits[b, t].argmax() == targets[b, t]) for b, t in picked)
    assert float(aux["correct"]) == right


@pytest.mark.slow  # a float64 model compiled three times (~16 s on the loaded 2-core box)
def test_loss_is_on_the_weighted_tokens_only_in_float64(tokenizers):
    """training/steps.loss_fn on chat batches (packed: two conversations a row; and bucketed)
    equals the hand computation: each conversation alone through the model, -log p(target)
    summed over the assistant targets, over their count."""
    from flax_transformer.nn.kinds import model_for
    from flax_transformer.spec.presets import preset
    from flax_transformer.training.steps import loss_fn

    _, ours = tokenizers["qwen25"]
    template = ChatTemplate.of_tokenizer(ours)
    chats = [(m, f"f:{i}") for i, m in enumerate(CHATS)]
    with jax.enable_x64(True):
        config = preset(
            "tiny", tgt_vocab_size=hf_chat.VOCAB, src_vocab_size=hf_chat.VOCAB, max_len=256,
            dtype="float64", param_dtype="float64", dropout_rate=0.0,
        )  # fmt: skip
        model = model_for(config, "lm")
        dataset = encode_chats(chats, ours, template, max_len=config.max_len)
        params = model.init(jax.random.key(0), np.zeros((1, 8), np.int32))["params"]
        apply = jax.jit(model.apply)
        loss_of = jax.jit(functools.partial(loss_fn, model=model))
        # By hand: the conversations right-padded in one batch (causal: each sees only
        # itself), -log softmax at each target, summed with the weights.
        width = max(len(t) for t in dataset.tgt_in)
        tokens = np.zeros((len(dataset), width), np.int32)
        for row, tgt_in in enumerate(dataset.tgt_in):
            tokens[row, : len(tgt_in)] = tgt_in
        logits = np.asarray(apply({"params": params}, tokens))
        nll_sum, weight_sum = 0.0, 0.0
        for row, (tgt_out, weights) in enumerate(
            zip(dataset.tgt_out, dataset.tgt_weights, strict=True)
        ):
            shifted = logits[row, : len(tgt_out)] - logits[row, : len(tgt_out)].max(
                -1, keepdims=True
            )
            log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            nll = -log_probs[np.arange(len(tgt_out)), tgt_out]
            nll_sum += float((nll * weights).sum())
            weight_sum += float(weights.sum())
        expected = nll_sum / weight_sum
        packed = next(iter(BatchLoader(dataset, 1, config.max_len, seed=0, pack=True)))
        assert packed["tgt_segments"].max() == len(dataset)  # all of them in one row
        assert packed["tgt_weights"].sum() == weight_sum
        loss, aux = loss_of(params, packed)
        assert abs(float(loss) - expected) <= 1e-12 * abs(expected)
        assert float(aux["token_count"]) == weight_sum
        bucketed = make_batch(dataset, range(len(dataset)), width, len(dataset))
        loss, _ = loss_of(params, bucketed)
        assert abs(float(loss) - expected) <= 1e-12 * abs(expected)
        # Without the weights every non-pad target counts: a different loss.
        unweighted = {k: v for k, v in bucketed.items() if k != "tgt_weights"}
        unweighted, _ = loss_of(params, unweighted)
        assert abs(float(unweighted) - expected) > 1e-3


def test_a_chat_file_through_the_one_call(tmp_path, tokenizers):
    _, ours = tokenizers["qwen25"]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))
    dataset = read_finetune_dataset(path, ours, max_len=200)
    chats = [(m, f"{path}:{i}") for i, m in enumerate(CHATS, start=1)]
    expected = encode_chats(chats, ours, ChatTemplate.of_tokenizer(ours), max_len=200)
    for name in ("tgt_in", "tgt_out", "tgt_weights"):
        for a, b in zip(getattr(dataset, name), getattr(expected, name), strict=True):
            np.testing.assert_array_equal(a, b)
    # A tokenizer without a template (here: not loaded from a directory): file and line.
    bare = HFTokenizer(ours._tok, pad_id=0, bos_id=0, eos_id=0, vocab_size=hf_chat.VOCAB)
    with pytest.raises(DataError, match=f"^{path}:1: the run's tokenizer .* has no chat template"):
        read_finetune_dataset(path, bare, max_len=200)


def test_training_inputs_read_their_files_in_read_not_when_made(tmp_path):
    """A chat or classifier input is made without touching a file (the run directories are
    read first); read() reads the files and names a missing one."""
    from flax_transformer.data.classify_input import ClassifyInput
    from flax_transformer.data.corpus_input import ChatInput

    missing = str(tmp_path / "missing.jsonl")
    chat = ChatInput(missing, None, seed=0)
    classify = ClassifyInput(missing, None, 0, hf_config={}, init_from=tmp_path)
    for made in (chat, classify):
        with pytest.raises((DataError, FileNotFoundError), match="missing.jsonl"):
            made.read(scan=True)
