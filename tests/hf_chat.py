# ruff: noqa: E501  (the templates are written line for line as they ship)
"""Chat fixtures: real chat templates (written here as Llama 3 Instruct and Qwen2.5 Instruct
ship them in tokenizer_config.json; nothing is downloaded), a byte-level BPE tokenizer trained
here on a few sentences with both families' special tokens, saved as transformers saves it,
and a tiny Llama trained briefly to answer in the Llama 3 chat format.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

# Meta-Llama-3-8B-Instruct's template.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>"
    "assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# The same with transformers' {% generation %} markers around each reply (what a template for
# return_assistant_tokens_mask looks like).
LLAMA3_MARKED = (
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

# Qwen2.5-Instruct's template (ChatML, a default system prompt, tools).
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Plain ChatML with markers around each reply and its end (for the assistant mask).
CHATML_MARKED = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>"]
LLAMA3_SPECIALS += ["<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The tokenizer's own training text, and the tiny model's conversations.
SENTENCES = [
    "You are a helpful assistant. You are Qwen, created by Alibaba Cloud.",
    "Hello there, how are you today? I am fine, thank you for asking.",
    "What is the capital of France? The capital of France is Paris.",
    "Tell me a short story about a cat who sits on a mat in the sun.",
    "system user assistant tool Be brief. Answer in one word.",
]
VOCAB = 320  # the tiny model's vocabulary: the tokenizer's ids and some unused ones


@functools.lru_cache(maxsize=1)
def trained_bpe() -> str:
    """A byte-level BPE of 300 ids trained on SENTENCES with both families' special tokens
    (ids 0-7), as tokenizers JSON (trained once per process)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=LLAMA3_SPECIALS + QWEN_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    return tok.to_str()


def tokenizer_directory(path: Path, family: str, template: str, where: str = "jinja") -> Path:
    """trained_bpe() saved by transformers into `path` with Llama 3's (bos <|begin_of_text|>,
    eos <|eot_id|>) or Qwen2's (no bos, eos <|im_end|>, pad <|endoftext|>) named tokens and
    `template`: in chat_template.jinja (where="jinja", transformers 5) or in
    tokenizer_config.json (where="config", transformers 4)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    named = (
        dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        if family == "llama"
        else dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")
    )
    tok = Tokenizer.from_str(trained_bpe())
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template, **named)
    wrapped.save_pretrained(path)
    if where == "config":  # as transformers 4 saved it
        (path / "chat_template.jinja").unlink()
        config = json.loads((path / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


CONVERSATIONS = [
    [{"role": "user", "content": "Hello there, how are you today?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "  I am fine, thank you.  "},
        {"role": "user", "content": "Tell me a short story <|im_end|> about a cat."},
    ],
]


def train_chat_llama(tokenizer_dir: Path, steps: int = 30, seed: int = 0):
    """A tiny transformers Llama (vocab VOCAB) trained `steps` Adam steps on one Llama 3 chat
    (system, user, assistant reply ending in <|eot_id|>), so that greedy decoding answers and
    stops at <|eot_id|>; returned in eval mode. Its config's eos is <|end_of_text|> and its
    generation config's eos the list [<|end_of_text|>, <|eot_id|>], as Llama 3 Instruct's."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tok.convert_tokens_to_ids
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ]
    text = tok.apply_chat_template(chat, tokenize=False)
    tokens = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=ids("<|begin_of_text|>"), eos_token_id=ids("<|end_of_text|>"),
        rms_norm_eps=1e-6,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    try:
        for _ in range(steps):
            loss = model(input_ids=tokens, labels=tokens).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.generation_config.eos_token_id = [ids("<|end_of_text|>"), ids("<|eot_id|>")]
    model.generation_config.bos_token_id = ids("<|begin_of_text|>")
    return model.eval()


def transformers_reply(model, tokenizer, messages, max_new_tokens: int) -> list[int]:
    """transformers' greedy new tokens for the chat template's prompt of `messages` (ending
    with the end id it stopped at, when it stopped)."""
    import torch

    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return np.asarray(out[0, len(prompt) :]).tolist()
