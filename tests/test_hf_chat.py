"""Chat templates (hf/chat_template.py) rendered as transformers' apply_chat_template renders
them, and `ftx generate --chat` on an imported run: the same reply tokens as transformers'
generate on the same prompt."""

from __future__ import annotations

import shutil

import pytest

from flax_transformer.cli import generate as generate_cli
from flax_transformer.hf.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    read_chat_template,
    reply_end_ids,
)
from flax_transformer.hf.tokenizer import HFTokenizer

from . import hf_chat

transformers = pytest.importorskip("transformers")

TEMPLATES = {"llama": hf_chat.LLAMA3_TEMPLATE, "qwen": hf_chat.QWEN25_TEMPLATE}


class Tokenizers(dict):
    """{(family, template, where): (transformers tokenizer, HFTokenizer)}, built on first use."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, key):
        family, template, where = key
        path = self.tmp_path_factory.mktemp(f"tok_{family}")
        hf_chat.tokenizer_directory(path, family, template, where)
        theirs = transformers.AutoTokenizer.from_pretrained(path)
        ours = HFTokenizer(theirs, pad_id=0, bos_id=0, eos_id=0, vocab_size=320, directory=path)
        self[key] = (theirs, ours)
        return self[key]


@pytest.fixture(scope="session")
def chat_tokenizers(tmp_path_factory):
    return Tokenizers(tmp_path_factory)


def apply_chat_template(tokenizer, messages, **kwargs):
    return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)


@pytest.mark.parametrize("where", ["jinja", "config"])
@pytest.mark.parametrize("family", list(TEMPLATES))
def test_prompt_ids_equal_apply_chat_template(chat_tokenizers, family, where):
    """With and without a system message, a reply in the history, an added token typed by the
    user; the template in chat_template.jinja (transformers 5) or tokenizer_config.json."""
    theirs, ours = chat_tokenizers[family, TEMPLATES[family], where]
    template = ChatTemplate.of_tokenizer(ours)
    assert template.source == theirs.chat_template == TEMPLATES[family]
    for messages in hf_chat.CONVERSATIONS:
        expected = apply_chat_template(theirs, messages, add_generation_prompt=True)
        assert template.prompt_ids(ours, messages) == expected
        text = theirs.apply_chat_template(messages, tokenize=False)
        assert template.render(messages) == text  # and without the generation prompt


def test_the_environment_is_transformers(chat_tokenizers):
    """tojson (no HTML escaping, non-ASCII kept, its options), namespace, dict, loop controls,
    strftime_now, trim_blocks / lstrip_blocks and the special tokens in the context."""
    source = """{%- set ns = namespace(n=0) %}
{% for m in messages %}
    {% if m.role == 'system' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    {{ ns.n }}: {{ m | tojson }} {{ dict(a=1, b='<&>') | tojson(indent=2, sort_keys=true) }}
{% endfor %}
{{ eos_token }}{{ strftime_now('%Y') }}{% if add_generation_prompt %}>{% endif %}"""
    theirs, ours = chat_tokenizers["llama", hf_chat.LLAMA3_TEMPLATE, "jinja"]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": 'é <b> & "q"'}]
    template = ChatTemplate(source, ours.special_tokens, "test")
    for prompt in (False, True):
        expected = theirs.apply_chat_template(
            messages, chat_template=source, tokenize=False, add_generation_prompt=prompt
        )
        assert template.render(messages, add_generation_prompt=prompt) == expected
    assert "<|eot_id|>" in expected and '"é <b> & \\"q\\""' in expected


MISTRAL_TEMPLATE = (  # Mistral-7B-Instruct-v0.1's: no system role, and it says so
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)


def test_errors_are_one_line_and_name_the_file(tmp_path, chat_tokenizers):
    hf_chat.tokenizer_directory(tmp_path, "llama", hf_chat.LLAMA3_TEMPLATE)
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ChatTemplateError) as err:
        read_chat_template(tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "chat_template.jinja" in message and '"chat_template" key in tokenizer_config' in message

    _, ours = chat_tokenizers["llama", hf_chat.LLAMA3_TEMPLATE, "jinja"]
    template = ChatTemplate(MISTRAL_TEMPLATE, ours.special_tokens, "dir/chat_template.jinja")
    rendered = template.render([{"role": "user", "content": "hi"}])
    assert rendered == "<|begin_of_text|>[INST] hi [/INST]"
    with pytest.raises(ChatTemplateError, match="^dir/chat_template.jinja: the chat template "
                       "failed: Conversation roles must alternate user/assistant"):  # fmt: skip
        template.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with pytest.raises(ChatTemplateError, match=r"does not compile \(template line 1\)"):
        ChatTemplate("{% for m in messages %}", {}, "x")
    with pytest.raises(ChatTemplateError, match="underscore"):  # the sandbox's namespace
        ChatTemplate("{% set ns = namespace(_x=1) %}", {}, "x").render([])


def test_reply_end_ids_follow_transformers():
    assert reply_end_ids(2, {"eos_token_id": 2}, {}) == {2}
    assert reply_end_ids(5, {"eos_token_id": [5, 7]}, {}) == {5, 7}  # config.json's list
    assert reply_end_ids(5, {"eos_token_id": 5}, {"eos_token_id": [5, 9]}) == {5, 9}
    assert reply_end_ids(5, {}, {"eos_token_id": 9}) == {5, 9}


def test_chat_flags_are_checked(capsys):
    for argv, said in (
        (["--system", "s"], "--system needs --chat"),
        (["--chat", "--echo"], "--echo and --chat"),
    ):
        with pytest.raises(SystemExit) as exit_:
            generate_cli.parse_args(["--workdir", "run", *argv])
        assert exit_.value.code == 2 and said in capsys.readouterr().err


# ----------------------------------------------------------------------------- ftx generate --chat
@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """(transformers model, its tokenizer, the run imported from them): a tiny Llama trained
    on one Llama 3 chat; the template stored in tokenizer_config.json (transformers 4)."""
    from flax_transformer.runs.hf_convert import import_run

    root = tmp_path_factory.mktemp("chat_run")
    hf_dir = hf_chat.tokenizer_directory(
        root / "hf", "llama", hf_chat.LLAMA3_TEMPLATE, where="config"
    )
    model = hf_chat.train_chat_llama(hf_dir)
    model.save_pretrained(hf_dir)
    import_run(hf_dir, root / "run")
    return model, transformers.AutoTokenizer.from_pretrained(hf_dir), root / "run"


@pytest.mark.slow  # a tiny Llama trained and imported, and the CLI's decoder compiled
def test_generate_chat_replies_as_transformers(chat_run, tmp_path, capsys):
    model, tokenizer, run_dir = chat_run
    # The import carries the template (now as chat_template.jinja) with the tokenizer.
    assert read_chat_template(run_dir / "hf_tokenizer") == hf_chat.LLAMA3_TEMPLATE
    users = ["What is the capital of France?", "Hello there, how are you today?"]
    (tmp_path / "in.txt").write_text("\n".join(users) + "\n")
    argv = ["--workdir", str(run_dir), "--input", str(tmp_path / "in.txt"), "--chat"]
    argv += ["--system", "Be brief.", "--max-new-tokens", "24"]
    assert generate_cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    for user, line in zip(users, lines, strict=True):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}]
        theirs = hf_chat.transformers_reply(model, tokenizer, messages, 24)
        if user == users[0]:  # the trained chat: its reply ends at <|eot_id|>, not at the
            assert theirs[-1] == eot  # run's eos (<|end_of_text|>): the cut is exercised
        reply = theirs[:-1] if theirs[-1] in (eot, model.config.eos_token_id) else theirs
        assert line == tokenizer.decode(reply, skip_special_tokens=True).replace("\n", "\\n")
    # The same tokens, not only the same text: the generator's own rows.
    from dataclasses import fields

    from flax_transformer.runs.generate import GenerateOptions, prepare
    from flax_transformer.runs.load import open_run

    args = generate_cli.parse_args(argv)  # the command's options, its preparation of the run
    options = GenerateOptions(**{f.name: getattr(args, f.name) for f in fields(GenerateOptions)})
    generator = prepare(open_run(run_dir), options, run_dir)
    assert generator.end_ids == {eot, model.config.eos_token_id}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": users[0]}]
    prompt = generator.encode(users[0], 1)
    assert prompt == apply_chat_template(tokenizer, messages, add_generation_prompt=True)
    ours = generator.decode_batch([prompt], 0)[0].tolist()
    theirs = hf_chat.transformers_reply(model, tokenizer, messages, 24)
    assert theirs[-1] == eot  # stopped there: so did the engine (pad after)
    assert ours == theirs + [generator.config.pad_id] * (24 - len(theirs))


@pytest.mark.slow  # (shares the imported run above)
def test_generate_chat_errors(chat_run, tmp_path, capsys):
    _, _, run_dir = chat_run
    bare = tmp_path / "run"
    shutil.copytree(run_dir, bare)
    (bare / "hf_tokenizer" / "chat_template.jinja").unlink()
    (tmp_path / "in.txt").write_text("hi\n")
    argv = ["--workdir", str(bare), "--input", str(tmp_path / "in.txt"), "--chat"]
    assert generate_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "no chat template" in err
    # A template that refuses the input: the line's error, an empty line in its place.
    (bare / "hf_tokenizer" / "chat_template.jinja").write_text(MISTRAL_TEMPLATE)
    assert generate_cli.main([*argv, "--system", "s", "--max-new-tokens", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "\n"
    assert "line 1: " in captured.err and "Conversation roles must alternate" in captured.err
