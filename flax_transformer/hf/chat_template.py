"""A tokenizer's chat template: a conversation as the text and token ids the model was tuned on,
rendered as transformers' `apply_chat_template` renders it (transformers/utils/
chat_template_utils.py, transformers 5), and the assistant's spans in it (the tokens a chat
fine-tune puts its loss on).

Where the template is: `chat_template.jinja` beside the tokenizer (what transformers 5 writes),
else the "chat_template" key of tokenizer_config.json (transformers 4: a string, or a list of
{"name", "template"} whose "default" one is used); the .jinja file wins, as in transformers.

How it renders: jinja2's immutable sandbox with trim_blocks and lstrip_blocks, the loop
controls, transformers' globals (raise_exception, strftime_now, dict, namespace) and its tojson
filter (no HTML escaping); the context is the messages (None values dropped, reasoning fields
aliased), tools and documents (None), add_generation_prompt and the tokenizer's named special
tokens (bos_token, eos_token, ...). The text is tokenized without added special tokens: the
template writes them.

The assistant spans: with `{% generation %}` markers in the template, the characters those
blocks render (transformers' return_assistant_tokens_mask); without them, by rendering
prefixes: assistant turn i spans from the end of the conversation before it rendered with the
generation prompt to the end of the conversation through it (both must be prefixes of the
whole; a template that renders history differently, e.g. one that drops earlier reasoning, is
refused). A token is in a span when its characters overlap it (transformers' rule).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
# The names a message's reasoning goes under; templates read the first (transformers aliases).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """No template, a template that does not compile, or one that raised; one line."""


def read_chat_template(directory: str | Path) -> str:
    """The chat template of the tokenizer files in `directory` (see the module docstring);
    ChatTemplateError naming the file and key when there is none."""
    directory = Path(directory)
    jinja_file = directory / CHAT_TEMPLATE_FILE
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ChatTemplateError(f"{jinja_file}: cannot read ({err})") from None
    config_file = directory / TOKENIZER_CONFIG
    template = None
    if config_file.is_file():
        try:
            template = json.loads(config_file.read_bytes()).get("chat_template")
        except (OSError, ValueError, AttributeError) as err:
            raise ChatTemplateError(f"{config_file}: cannot read ({err})") from None
    if isinstance(template, list):  # named templates: transformers uses "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str):
        raise ChatTemplateError(
            f"{directory}: no chat template (neither {CHAT_TEMPLATE_FILE} nor a "
            f'"chat_template" key in {TOKENIZER_CONFIG})'
        )
    return template


# ----------------------------------------------------------------------------- the environment
_SPANS: ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = ContextVar(
    "chat_template_spans", default=None
)


@functools.lru_cache(maxsize=16)
def compile_template(source: str):
    """The jinja2 Template of `source` in transformers' sandboxed environment (cached: a
    data set renders one template thousands of times)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationSpans(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: renders its body and, while `_SPANS` is
        set, records the body's (start, end) characters in the text rendered so far."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_record", [], [])
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _record(self, caller):
            text = caller()
            tracking = _SPANS.get()
            if tracking is not None:
                blocks, spans = tracking
                start = len("".join(blocks))
                spans.append((start, start + len(text)))
            return text

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters; transformers' does not
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:  # `dict(...)` without the class itself (no attribute access to it)
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):  # no underscore attributes
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot set underscore attributes on a namespace: {name!r}"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationSpans, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=strftime_now,
        dict=TemplateDict(),
        namespace=TemplateNamespace,
    )
    return env.from_string(source)


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """The messages as transformers hands them to a template: keys holding None dropped, the
    reasoning under each of its names."""
    out = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def first_line(err: BaseException) -> str:
    """An exception's message as one line (its first), for the one-line errors."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ----------------------------------------------------------------------------- the template
class ChatTemplate:
    """A chat template with the special tokens its context holds; `where` names it in errors
    (the file it came from)."""

    def __init__(self, source: str, special_tokens: dict[str, str], where: str):
        self.source, self.special_tokens, self.where = source, dict(special_tokens), where
        try:
            self._template = compile_template(source)
        except Exception as err:  # jinja2.TemplateSyntaxError, and any other compile failure
            line = getattr(err, "lineno", None)
            at = f" (template line {line})" if line else ""
            raise ChatTemplateError(
                f"{where}: the chat template does not compile{at}: {first_line(err)}"
            ) from None
        self.has_generation_markers = bool(GENERATION_TAG.search(source))

    @classmethod
    def of_tokenizer(cls, tokenizer) -> ChatTemplate:
        """The template of an HFTokenizer loaded from a directory (a run's hf_tokenizer/);
        ChatTemplateError naming what is missing."""
        directory = getattr(tokenizer, "directory", None)
        if directory is None:
            kind = getattr(tokenizer, "kind", type(tokenizer).__name__)
            raise ChatTemplateError(
                f"the run's tokenizer ({kind}) has no chat template: only a Hugging Face "
                "tokenizer directory (an `ftx hf import` run) carries one"
            )
        source = read_chat_template(directory)
        jinja_file = Path(directory) / CHAT_TEMPLATE_FILE
        where = str(jinja_file if jinja_file.is_file() else Path(directory) / TOKENIZER_CONFIG)
        return cls(source, tokenizer.special_tokens, where)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as text; ChatTemplateError when the template raises."""
        context = self._context(messages, add_generation_prompt)
        try:
            return self._template.render(**context)
        except Exception as err:  # raise_exception's TemplateError, a sandbox refusal, ...
            raise ChatTemplateError(
                f"{self.where}: the chat template failed: {first_line(err)}"
            ) from None

    def render_with_generation_spans(self, messages: Sequence[dict]) -> tuple[str, list]:
        """(text, the (start, end) characters of each `{% generation %}` block)."""
        blocks, spans = [], []
        token = _SPANS.set((blocks, spans))
        try:
            for block in self._template.generate(**self._context(messages, False)):
                blocks.append(block)
        except Exception as err:
            raise ChatTemplateError(
                f"{self.where}: the chat template failed: {first_line(err)}"
            ) from None
        finally:
            _SPANS.reset(token)
        return "".join(blocks), spans

    def assistant_spans(self, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
        """(the whole conversation's text, the (start, end) characters of its assistant
        replies): by the generation markers when the template has them, else by rendering
        prefixes (the module docstring). ChatTemplateError when the prefixes do not line up."""
        if self.has_generation_markers:
            return self.render_with_generation_spans(messages)
        text = self.render(messages)
        spans = []
        for index, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(messages[:index], add_generation_prompt=True)
            through = self.render(messages[: index + 1])
            if not (text.startswith(before) and text.startswith(through)) or len(through) < len(
                before
            ):
                raise ChatTemplateError(
                    f"{self.where}: the template renders the turns before assistant message "
                    f"{index + 1} differently inside the whole conversation, so its reply "
                    "cannot be found by rendering prefixes (give the template {% generation %} "
                    "markers)"
                )
            spans.append((len(before), len(through)))
        return text, spans

    def prompt_ids(self, tokenizer, messages: Sequence[dict]) -> list[int]:
        """The ids of the conversation with the generation prompt: what
        `apply_chat_template(messages, add_generation_prompt=True, tokenize=True)` gives."""
        return tokenizer.encode(self.render(messages, add_generation_prompt=True))

    def ids_and_assistant_mask(self, tokenizer, messages: Sequence[dict]):
        """(ids of the whole conversation, 0/1 per id: 1 on the assistant replies' tokens)."""
        text, spans = self.assistant_spans(messages)
        ids, offsets = tokenizer.encode_with_offsets(text)
        return ids, tokens_in_spans(offsets, spans)

    def _context(self, messages, add_generation_prompt: bool) -> dict:
        return {
            **self.special_tokens,
            "messages": template_messages(messages),
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }


def tokens_in_spans(offsets, spans) -> list[int]:
    """1 for each token whose (start, end) characters overlap one of the sorted `spans`, else 0:
    apply_chat_template's rule (a token cut by a span's edge counts)."""
    mask, span = [0] * len(offsets), 0
    for index, (start, end) in enumerate(offsets):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        if span == len(spans):
            break
        if end > spans[span][0]:
            mask[index] = 1
    return mask


def reply_end_ids(eos_id: int, hf_config: dict, generation_config: dict) -> set[int]:
    """The ids a chat reply ends at, as transformers' generate stops: the generation config's
    eos_token_id (one id or a list; Llama 3 ends a reply with <|eot_id|>, not its config's
    <|end_of_text|>), else config.json's, and the run's own eos_id."""
    ends = generation_config.get("eos_token_id", hf_config.get("eos_token_id"))
    ends = [] if ends is None else [ends] if isinstance(ends, int) else list(ends)
    return {int(eos_id), *(int(i) for i in ends)}
