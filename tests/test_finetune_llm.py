"""Fine-tuning an imported decoder LLM (issue 39): `ftx train --init-from RUN` on plain text,
{"text"} JSONL and chat JSONL, then `ftx hf export` back. The run's validation NLL
(results.json) is transformers' cross-entropy of the exported model on the same examples, on
every token of a document and on the assistant tokens only of a conversation (transformers'
own return_assistant_tokens_mask, from a template with {% generation %} markers): a run that
weighed every conversation token, or dropped a document's EOS, fails. The export loads in
transformers strictly and gives the fine-tuned run's float32 logits within 1e-5. Bad input is
one line, before anything is written.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from flax_transformer.cli import train as train_cli
from flax_transformer.cli.hf import main as hf_main
from flax_transformer.spec.numerics import assert_close

from . import hf_chat, hf_models

transformers = pytest.importorskip("transformers")

SIZES = dict(
    vocab_size=hf_chat.VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=128,
)  # fmt: skip
# family: (transformers class prefix, config changes): GQA, Gemma's MQA and wide heads,
# Phi-3's fused qkv_proj / gate_up_proj.
FAMILIES = {
    "llama": ("Llama", dict(num_key_value_heads=2)),
    "gemma": ("Gemma", dict(num_key_value_heads=1, head_dim=10)),
    "phi3": ("Phi3", dict(num_key_value_heads=2, pad_token_id=0)),
}
SLOW = {"gemma", "phi3"}  # the same path as llama's; the fast suite runs llama's
DOCUMENTS = [s for s in hf_chat.SENTENCES for _ in range(3)]
CHATS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ],
    [
        {"role": "user", "content": "Hello there, how are you today?"},
        {"role": "assistant", "content": "I am fine, thank you for asking."},
        {"role": "user", "content": "Tell me a short story."},
        {"role": "assistant", "content": "A cat sits on a mat in the sun."},
    ],
]
VALID_CHAT = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
]
TRAIN_FLAGS = ["--steps", "6", "--batch-size", "4", "--pack", "--lr", "1e-2", "--warmup", "2",
               "--label-smoothing", "0", "--eval-every", "6", "--save-every", "6"]  # fmt: skip


def family_params(*fast):
    return [f if f in fast or f not in SLOW else pytest.param(f, marks=pytest.mark.slow)
            for f in FAMILIES]  # fmt: skip


class Imported(dict):
    """{family: (imported run directory, transformers tokenizer)}: a tiny random model of the
    family with the Llama 3 chat tokenizer (its template marked for transformers' assistant
    mask), saved and imported on first use."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, family):
        root = self.tmp_path_factory.mktemp(f"finetune_{family}")
        hf_dir = hf_chat.tokenizer_directory(root / "hf", "llama", hf_chat.LLAMA3_MARKED)
        tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
        ids = tokenizer.convert_tokens_to_ids
        prefix, changes = FAMILIES[family]
        ends = dict(bos_token_id=ids("<|begin_of_text|>"), eos_token_id=ids("<|eot_id|>"))
        config = getattr(transformers, f"{prefix}Config")(**SIZES, **changes, **ends)
        torch.manual_seed(0)
        getattr(transformers, f"{prefix}ForCausalLM")(config).save_pretrained(hf_dir)
        assert hf_main(["import", str(hf_dir), str(root / "run")]) == 0
        self[family] = (root / "run", tokenizer)
        return self[family]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return Imported(tmp_path_factory)


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def nll_of(model, sequences) -> float:
    """transformers' mean cross-entropy over the weighted targets of [(ids, weights)]
    (weights[i]: of the target ids[i + 1])."""
    total, count = 0.0, 0.0
    with torch.no_grad():
        for ids, weights in sequences:
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
            nll = -torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]]
            total += float((nll * torch.tensor(weights, dtype=torch.float64)).sum())
            count += float(sum(weights))
    return total / count


def document_sequences(tokenizer, run, texts):
    """[bos] + text + [eos] as the run encodes a document, every target weighing 1."""
    out = []
    for text in texts:
        ids = [run.tokenizer.bos_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]
        ids.append(run.tokenizer.eos_id)
        out.append((ids, [1.0] * (len(ids) - 1)))
    return out


def chat_sequences(tokenizer, chats):
    """The template's ids and transformers' assistant mask (of the targets)."""
    out = []
    for messages in chats:
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        mask = [float(m) for m in rendered["assistant_masks"]]
        assert 0 < sum(mask) < len(mask)  # (a weight of 1 everywhere would differ)
        out.append((list(rendered["input_ids"]), mask[1:]))
    return out


def project_logits(workdir, ids) -> np.ndarray:
    """The fine-tuned run's float32 logits (its last checkpoint, this project's forward)."""
    from flax_transformer.hf.model import HFModel
    from flax_transformer.runs.load import load_run

    run = load_run(workdir)
    hf_config = json.loads((workdir / "hf_config.json").read_text())
    model = HFModel(run.model, run.params, run.config, hf_config)
    return model.forward(np.asarray([ids]))[0]


def fine_tune_and_export(run, tmp_path, data_flags):
    workdir, out = tmp_path / "tuned", tmp_path / "exported"
    argv = ["--init-from", str(run), *data_flags, "--workdir", str(workdir), *TRAIN_FLAGS]
    assert train_cli.main(argv) == 0
    assert hf_main(["export", str(workdir), str(out)]) == 0
    results = json.loads((workdir / "results.json").read_text())
    exported, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, dtype=torch.float32
    )
    assert not any(info.values()), info  # strict: no missing, unexpected or mismatched keys
    return workdir, out, results, exported.eval()


def check_export_logits(workdir, exported, ids, what):
    with torch.no_grad():
        theirs = exported(input_ids=torch.tensor([ids])).logits[0].numpy()
    assert_close(project_logits(workdir, ids), theirs, rtol=1e-5, what=what)


@pytest.mark.slow  # a fine-tune (its steps compiled) and an export, per family
@pytest.mark.parametrize("fmt", ["text", "jsonl"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_text_fine_tune_counts_every_token_and_exports_exactly(imported, family, fmt, tmp_path):
    run, tokenizer = imported[family]
    train, valid = DOCUMENTS[:-2], DOCUMENTS[-2:]
    if fmt == "text":
        flags = ["--lm-text", write_lines(tmp_path / "train.txt", train)]
        flags += ["--lm-valid", write_lines(tmp_path / "valid.txt", valid)]
    else:
        as_json = [json.dumps({"text": t}) for t in train], [json.dumps({"text": t}) for t in valid]
        flags = ["--train-jsonl", write_lines(tmp_path / "train.jsonl", as_json[0])]
        flags += ["--valid-jsonl", write_lines(tmp_path / "valid.jsonl", as_json[1])]
    from flax_transformer.runs.load import load_run

    sequences = document_sequences(tokenizer, load_run(run), valid)
    before = nll_of(transformers.AutoModelForCausalLM.from_pretrained(run.parent / "hf"), sequences)
    workdir, _, results, exported = fine_tune_and_export(run, tmp_path, map(str, flags))
    after = nll_of(exported, sequences)
    assert results["valid_nll"] == pytest.approx(after, rel=1e-5)  # every token, EOS included
    assert after < before - 0.1  # it learned
    check_export_logits(workdir, exported, sequences[0][0], f"fine-tuned {family} logits")


@pytest.mark.parametrize("family", family_params("llama"))
@pytest.mark.slow  # (llama's too: ~20 s of compiling; the bad-input tests below are fast)
def test_chat_fine_tune_learns_the_replies_only_and_exports_exactly(imported, family, tmp_path):
    run, tokenizer = imported[family]
    flags = [
        "--train-jsonl",
        write_lines(tmp_path / "chat.jsonl", [json.dumps({"messages": c}) for c in CHATS * 4]),
    ]
    flags += ["--valid-jsonl", write_lines(tmp_path / "valid.jsonl",
                                           [json.dumps({"messages": VALID_CHAT})])]  # fmt: skip
    sequences = chat_sequences(tokenizer, [VALID_CHAT])
    everything = [(ids, [1.0] * len(weights)) for ids, weights in sequences]
    before = nll_of(transformers.AutoModelForCausalLM.from_pretrained(run.parent / "hf"), sequences)
    workdir, out, results, exported = fine_tune_and_export(run, tmp_path, map(str, flags))
    after = nll_of(exported, sequences)
    assert results["valid_nll"] == pytest.approx(after, rel=1e-5)  # the replies' tokens only
    assert abs(nll_of(exported, everything) - after) > 1e-3  # (all-ones weights would differ)
    assert after < before - 0.1
    check_export_logits(workdir, exported, sequences[0][0], f"chat-tuned {family} logits")
    # The export keeps the chat template: transformers renders the same prompt from it.
    reread = transformers.AutoTokenizer.from_pretrained(out)
    assert reread.chat_template == hf_chat.LLAMA3_MARKED


def test_a_chat_jsonl_is_read_as_conversations_weighed_on_the_replies(imported, tmp_path):
    """The training command's input for a {"messages"} --train-jsonl (data/corpus_input.py's
    ChatInput): the template's ids, tgt_weights = transformers' assistant mask; a {"text"} file
    stays a token-cache corpus."""
    from flax_transformer.data.corpus_input import ChatInput, CorpusInput
    from flax_transformer.runs.checks import data_kind
    from flax_transformer.runs.run_dir import read_tokenizer
    from flax_transformer.runs.spec import TrainSpec
    from flax_transformer.runs.train_data import corpus_input, corpus_source

    run, tokenizer = imported["llama"]
    chats = write_lines(tmp_path / "chat.jsonl", [json.dumps({"messages": c}) for c in CHATS])
    valid = write_lines(tmp_path / "valid.jsonl", [json.dumps({"messages": VALID_CHAT})])
    spec = TrainSpec(train_jsonl=str(chats), valid_jsonl=str(valid), init_from=str(run))
    chat_input = corpus_input(spec, corpus_source(spec), data_kind(spec))
    assert isinstance(chat_input, ChatInput) and chat_input.kind == "lm"
    chat_input.read(scan=True)
    sets = chat_input.datasets(read_tokenizer(run), 128, "skip", tmp_path, primary=True)
    for dataset, conversations in zip(sets, (CHATS, [VALID_CHAT]), strict=True):
        expected = chat_sequences(tokenizer, conversations)
        assert len(dataset) == len(expected)
        for i, (ids, weights) in enumerate(expected):
            assert dataset.tgt_in[i].tolist() == ids[:-1]
            assert dataset.tgt_out[i].tolist() == ids[1:]
            assert dataset.tgt_weights[i].tolist() == weights
    texts = write_lines(tmp_path / "text.jsonl", [json.dumps({"text": t}) for t in DOCUMENTS])
    spec = TrainSpec(train_jsonl=str(texts), init_from=str(run))
    assert isinstance(corpus_input(spec, corpus_source(spec), data_kind(spec)), CorpusInput)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.slow  # a fine-tune and an export (~20 s of compiling)
def test_max_len_with_init_from_is_the_training_length(imported, tmp_path, capsys):
    """An import's max_len is its max_position_embeddings (32768 for Qwen2.5): --max-len with
    --init-from sets the longest training row (packing, buckets, the --batch-tokens budget)
    and leaves the model's config, and so the export, as they were."""
    run, tokenizer = imported["llama"]
    text = write_lines(tmp_path / "train.txt", DOCUMENTS)
    workdir, out = tmp_path / "tuned", tmp_path / "exported"
    flags = [f for f in TRAIN_FLAGS if f not in ("--pack", "--batch-size", "4")]
    argv = ["--init-from", run, "--lm-text", text, "--max-len", "16", "--batch-tokens", "64"]
    capsys.readouterr()
    assert train_cli.main([*map(str, argv), "--workdir", str(workdir), *flags]) == 0
    # 64 tokens hold rows of 16, not one of the model's 128 (refused: too small a budget).
    assert (
        "--batch-tokens 64: 2 batch shapes (rows x length) 8x8, 4x16\n" in capsys.readouterr().out
    )
    assert hf_main(["export", str(workdir), str(out)]) == 0
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert json.loads((workdir / "config.json").read_text())["max_len"] == 128
    assert exported.config.max_position_embeddings == SIZES["max_position_embeddings"]
    ids = tokenizer("The capital of France is Paris.")["input_ids"]
    check_export_logits(workdir, exported, ids, "fine-tuned on 16-token rows")


def train_error(argv, capsys) -> str:
    """The training command's one-line error (exit 2), nothing written."""
    capsys.readouterr()  # (what came before: a fixture's progress bars)
    code = train_cli.main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_chat_data_errors(imported, tmp_path, capsys):
    run, _ = imported["llama"]
    workdir = tmp_path / "tuned"
    lines = [json.dumps({"messages": c}) for c in CHATS]
    chat = write_lines(tmp_path / "chat.jsonl", lines)
    err = train_error(["--train-jsonl", chat, "--workdir", workdir], capsys)
    assert err.startswith(f"error: --train-jsonl {chat} holds conversations")
    assert "a chat fine-tune starts from --init-from RUN" in err
    err = train_error(["--init-from", run, "--train-jsonl", chat, "--valid-tsv", chat], capsys)
    assert 'give --valid-jsonl of {"messages"} records' in err
    # A conversation without an assistant turn: named by file and line.
    unanswered = [{"role": "user", "content": "Hello there"}]
    bad = write_lines(tmp_path / "bad.jsonl", [lines[0], json.dumps({"messages": unanswered})])
    err = train_error(["--init-from", run, "--train-jsonl", bad, "--workdir", workdir], capsys)
    assert f"{bad} line 2: no assistant reply" in err
    # Conversations longer than the model's max_len (which --init-from takes as it is).
    long = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Paris. " * 99}]
    too_long = write_lines(tmp_path / "long.jsonl", [json.dumps({"messages": long})] * 3)
    argv = ["--init-from", run, "--train-jsonl", too_long, "--workdir", workdir]
    err = train_error(argv, capsys)
    assert f"{too_long}: no conversation fits the model's max_len 128 (all 2 are longer)" in err
    # A run whose tokenizer has no chat template.
    bare = tmp_path / "bare"
    shutil.copytree(run, bare)
    (bare / "hf_tokenizer" / "chat_template.jinja").unlink()
    err = train_error(["--init-from", bare, "--train-jsonl", chat, "--workdir", workdir], capsys)
    assert f"chat JSONL file {chat}: " in err and "no chat template" in err
    assert not workdir.exists()


def test_text_data_errors(imported, tmp_path, capsys):
    run, _ = imported["llama"]
    workdir = tmp_path / "tuned"
    empty = write_lines(tmp_path / "empty.txt", ["", "  "])
    err = train_error(["--init-from", run, "--lm-text", empty, "--workdir", workdir], capsys)
    assert f"text file {empty}: " in err
    # --max-len with --init-from is the training length: at most the model's own.
    text = write_lines(tmp_path / "train.txt", DOCUMENTS)
    argv = ["--init-from", run, "--lm-text", text, "--max-len", "129", "--workdir", workdir]
    err = train_error(argv, capsys)
    assert f"--max-len 129: the --init-from model {run} holds sequences of at most 128" in err
    # A run that is not a decoder-only language model: an imported BERT encoder.
    encoder_dir, encoder_run = tmp_path / "bert", tmp_path / "bert_run"
    config = hf_models.encoder_only_config("bert")
    config.architectures = ["BertModel"]
    hf_models.save(transformers.BertModel(config), encoder_dir)
    hf_models.encoder_only_tokenizer(encoder_dir)
    assert hf_main(["import", str(encoder_dir), str(encoder_run)]) == 0
    capsys.readouterr()
    text = write_lines(tmp_path / "train.txt", DOCUMENTS)
    err = train_error(["--init-from", encoder_run, "--lm-text", text, "--workdir", workdir], capsys)
    assert "holds an encoder model, not a decoder-only language model" in err
    assert not workdir.exists()


@pytest.mark.slow  # per family: the CLI's decoder compiled
@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_chat_replies_as_transformers_in_every_family(imported, family, tmp_path):
    """`ftx generate --chat --system` on an imported Llama, Gemma or Phi-3: the prompt is the
    chat template's and the reply transformers' greedy tokens (test_hf_chat has Llama's
    trained chat, whose reply stops at <|eot_id|>)."""
    from flax_transformer.cli import generate as generate_cli
    from flax_transformer.runs.generate import GenerateOptions, prepare
    from flax_transformer.runs.load import open_run

    run, tokenizer = imported[family]
    model = transformers.AutoModelForCausalLM.from_pretrained(run.parent / "hf").eval()
    user = "What is the capital of France?"
    (tmp_path / "in.txt").write_text(user + "\n")
    argv = ["--workdir", str(run), "--input", str(tmp_path / "in.txt"), "--chat"]
    argv += ["--system", "Be brief.", "--max-new-tokens", "12"]
    assert generate_cli.main(argv) == 0
    args = generate_cli.parse_args(argv)
    options = GenerateOptions(**{f: getattr(args, f) for f in GenerateOptions.__dataclass_fields__})
    generator = prepare(open_run(run), options, run)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}]
    prompt = generator.encode(user, 1)
    theirs_prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert prompt == theirs_prompt
    ours = generator.decode_batch([prompt], 0)[0].tolist()
    theirs = hf_chat.transformers_reply(model, tokenizer, messages, 12)
    assert ours[: len(theirs)] == theirs, family
