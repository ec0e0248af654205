"""The generate workflow (`ftx generate`): text lines translated or continued with a run;
`prepare(run, options, workdir) -> Generator`, then `generate_lines(lines, generator,
batch_size) -> (outputs, errors)`. cli/generate.py checks the flags, builds GenerateOptions,
reads the input and prints the outputs (what the command does is said there)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.files.text_lines import LineDecodeError, decode_line
from flax_transformer.spec.kinds import LM

BUCKET = 16  # source/prompt widths are rounded up to a multiple of this: fewer compilations


class InputError(ValueError):
    """One input line that cannot be decoded (the message names the problem)."""


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """How to generate: the search (decoding.strategies: Greedy, Beam, Sample; None: greedy),
    how many new tokens at most (None: as many as max_len allows), the sampling seed, an LM's
    prompt echoed, chat (the tokenizer's chat template, a system message) and int8 weights
    (int8) or int8 products (quantize="int8")."""

    strategy: Any = None
    max_new_tokens: int | None = None
    seed: int = 0
    echo: bool = False
    chat: bool = False
    system: str | None = None
    int8: bool = False
    quantize: str | None = None


def prepare(run, options: GenerateOptions, workdir: Path) -> Generator:
    """The Generator of a loaded run (runs.load.open_run) with the options' chat mode and
    weights (int8, int8 products, or float32 packed once); a ValueError (one line) for a chat
    run without a template or a --quantize run that is not float32."""
    if options.strategy is None:
        from flax_transformer.decoding.strategies import Greedy

        options = dataclasses.replace(options, strategy=Greedy())
    generator = Generator(run, options)
    if options.chat:  # no template, one that does not compile, not an LM run: a ValueError
        generator.chat_mode(workdir)
    if options.int8:  # int8 matrices in memory, dequantised inside the jitted decoder
        from flax_transformer.export.int8 import int8_model, quantize_variables

        generator.model, run.params = int8_model(run.model), quantize_variables(run.params)
    if options.quantize == "int8":  # int8 matrices and int8 x int8 -> int32 products
        if run.config.dtype != "float32" or run.config.param_dtype != "float32":
            raise ValueError(
                f"--quantize int8 needs a float32 run; {workdir} computes in "
                f"{run.config.dtype} with {run.config.param_dtype} weights"
            )
        from flax_transformer.nn.int8_products import int8_products_model, quantize_for_products

        generator.model = int8_products_model(run.model)
        run.params = quantize_for_products(run.params)
    elif not options.int8:  # float32 products on weights packed once, where kernels.f32_packed
        from flax_transformer.nn.f32_products import for_generation

        generator.model, run.params = for_generation(run.model, run.params, run.config)
    return generator


class Generator:
    """Turns text lines into token batches, decodes them, and tokens back into text."""

    def __init__(self, run, options: GenerateOptions):
        self.run, self.options = run, options
        self.model, self.tokenizer, self.config = run.model, run.tokenizer, run.config
        self.is_lm = run.model_kind == LM
        self.max_len = self.config.max_len
        self.chat, self.end_ids = None, {self.tokenizer.eos_id}  # (--chat: chat_mode)

    def chat_mode(self, workdir: Path) -> None:
        """--chat: prompts through the tokenizer's chat template, rows ended at every end id;
        ValueError (one line) for a run without a template or not an LM."""
        from flax_transformer.hf.chat_template import ChatTemplate, reply_end_ids
        from flax_transformer.runs.run_dir import HF_CONFIG, HF_GENERATION_CONFIG

        if not self.is_lm:
            kind = self.run.model_kind
            raise ValueError(f"--chat needs a decoder-only LM run; {workdir} is a {kind} run")
        self.chat = ChatTemplate.of_tokenizer(self.tokenizer)
        configs = [workdir / HF_CONFIG, workdir / HF_GENERATION_CONFIG]
        hf_config, generation = (json_or_empty(path) for path in configs)
        self.end_ids = reply_end_ids(self.tokenizer.eos_id, hf_config, generation)

    # ---- text -> tokens
    def encode(self, line: str | bytes, number: int) -> list[int]:
        """One input line (str or raw bytes) -> token ids: BOS + prompt for an LM, source + EOS
        for seq2seq. InputError, naming line `number`, for bad UTF-8, an empty line, too many
        tokens for max_len or ids outside the vocabulary."""
        if isinstance(line, bytes):
            try:
                line = decode_line(line)
            except LineDecodeError as err:
                raise InputError(f"line {number}: {err}") from None
        if not line.strip():
            raise InputError(f"line {number}: empty input")
        tok = self.tokenizer
        if self.is_lm:
            ids = self.chat_prompt(line, number) if self.chat else [tok.bos_id] + tok.encode(line)
            room = self.max_len - (self.options.max_new_tokens or 1) + 1
            if len(ids) > room:
                raise InputError(
                    f"line {number}: the prompt is {len(ids)} tokens (with BOS); with "
                    f"--max-new-tokens {self.options.max_new_tokens or 1} the model's max_len "
                    f"{self.max_len} allows at most {room}"
                )
        else:
            ids = tok.encode(line) + [tok.eos_id]
            if len(ids) > self.max_len:
                raise InputError(
                    f"line {number}: the input is {len(ids)} tokens (with EOS), longer than the "
                    f"model's max_len {self.max_len}"
                )
        vocab = self.config.tgt_vocab_size if self.is_lm else self.config.src_vocab_size
        if max(ids) >= vocab or min(ids) < 0:
            raise InputError(
                f"line {number}: the tokenizer gives id {max(ids)}, outside the model's "
                f"vocabulary [0, {vocab}) (tokenizer.json and config.json disagree)"
            )
        return ids

    def chat_prompt(self, line: str, number: int) -> list[int]:
        """--chat: [--system message,] the line as the user's message, with the generation
        prompt; the template writes the special tokens (a BOS where it has one)."""
        from flax_transformer.hf.chat_template import ChatTemplateError

        system = [{"role": "system", "content": self.options.system}] if self.options.system else []
        messages = [*system, {"role": "user", "content": line}]
        try:
            return self.chat.prompt_ids(self.tokenizer, messages)
        except ChatTemplateError as err:
            raise InputError(f"line {number}: {err}") from None

    # ---- tokens -> tokens
    def decode_batch(self, rows: list[list[int]], batch_index: int) -> np.ndarray:
        """Right-padded rows -> new tokens (len(rows), max_new_tokens)."""
        from flax_transformer.decoding.api import generate
        from flax_transformer.decoding.strategies import Beam, Sample

        width = min(-(-max(map(len, rows)) // BUCKET) * BUCKET, self.max_len)
        tokens = np.full((len(rows), width), self.config.pad_id, np.int32)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = row
        strategy, max_new = self.options.strategy, self.options.max_new_tokens
        if self.is_lm:
            lengths = np.array([len(r) for r in rows], np.int32)
            room = self.max_len - int(lengths.max()) + 1  # the longest prompt's room
            kind = dict(lengths=lengths, max_new_tokens=max_new or room)
        else:
            kind = dict(bos_id=self.tokenizer.bos_id, max_new_tokens=max_new or self.max_len)
        rng = self._key(batch_index) if isinstance(strategy, Sample) else None
        out = generate(
            self.model,
            self.run.params,
            tokens,
            strategy,
            eos_id=self.tokenizer.eos_id if len(self.end_ids) == 1 else sorted(self.end_ids),
            rng=rng,
            **kind,
        )
        if isinstance(strategy, Beam):
            out = out[0][:, 0]  # the best beam
        return np.asarray(out)

    def _key(self, batch_index: int):
        import jax

        return jax.random.fold_in(jax.random.key(self.options.seed), batch_index)

    # ---- tokens -> text
    def text(self, new_tokens: np.ndarray, prompt: str) -> str:
        """New tokens (max_new_tokens,) -> one output line: cut at the first EOS, decoded, the
        prompt prepended for an LM with --echo, and \\r / \\n written as the two characters so that
        each input gives one line."""
        ids = new_tokens.tolist()
        ends = [i for i, token in enumerate(ids) if token in self.end_ids]
        ids = ids[: ends[0]] if ends else ids
        out = self.tokenizer.decode(ids)
        if self.is_lm and self.options.echo:
            out = (prompt.decode("utf-8") if isinstance(prompt, bytes) else prompt) + out
        return out.replace("\r", "\\r").replace("\n", "\\n")


def json_or_empty(path: Path) -> dict:
    """A run's carried Hugging Face JSON file (hf_config.json, ...), {} when there is none."""
    import json

    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def batches(items: list, size: int) -> Iterator[list]:
    """Consecutive slices of `items` of `size` (the last one shorter)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def generate_lines(
    lines: Iterable[str], generator: Generator, batch_size: int
) -> tuple[list, list]:
    """(one output per line, error messages); a bad line gets an empty output."""
    lines = list(lines)
    outputs, errors, good = [""] * len(lines), [], []
    for number, line in enumerate(lines, start=1):
        try:
            good.append((number - 1, generator.encode(line, number)))
        except InputError as err:
            errors.append(str(err))
    for batch_index, batch in enumerate(batches(good, batch_size)):
        new_tokens = generator.decode_batch([ids for _, ids in batch], batch_index)
        for (index, _), row in zip(batch, new_tokens, strict=True):
            outputs[index] = generator.text(row, lines[index])
    return outputs, errors
