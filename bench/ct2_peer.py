"""CTranslate2 as a peer in `bench.hf_generate`, and the CPU's name and vector extensions.

CTranslate2 (`pip install ctranslate2`, or this project's `bench` extra) is what a CPU user
who wants Marian translations fast would pick. It is optional: `missing()` says why it cannot
be used, and the bench then leaves its columns out.

The checkpoint is converted with CTranslate2's own converter
(`ctranslate2.converters.TransformersConverter`, float32, once); `compute_type` picks float32
or int8 at load time (CTranslate2 quantises the weights itself, per output channel). The
bench's checkpoints are random and have no tokenizer files, so the converter is given a
stand-in tokenizer whose vocabulary names token i `t{i}` (`</s>`, `<unk>`, `<pad>` at
Marian's ids): CTranslate2 reads token strings, so ids go in and come out through that table.
As for opus-mt, the converter drops `<pad>` (the last id) from the vocabulary and starts the
decoder from a zero embedding, which is what transformers' Marian does with the pad row.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

# /proc/cpuinfo flags worth naming beside a speed table (matrix products and int8 dot
# products): absent ones are listed as such.
VECTOR_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def missing() -> str | None:
    """None when CTranslate2 can be imported, else one line saying so (and how to get it)."""
    try:
        import ctranslate2  # noqa: F401
        from ctranslate2.converters import TransformersConverter  # noqa: F401
    except ImportError as err:
        return (
            f"CTranslate2 is not installed ({err}); its columns are skipped "
            "(pip install 'flax-transformer[bench]' or pip install ctranslate2)"
        )
    return None


def version() -> str | None:
    with contextlib.suppress(ImportError):
        import ctranslate2

        return ctranslate2.__version__
    return None


def token_names(vocab_size: int, eos: int, pad: int, unk: int = 1) -> list[str]:
    """The stand-in vocabulary: index i is token id i's string."""
    special = {eos: "</s>", unk: "<unk>", pad: "<pad>"}
    return [special.get(i, f"t{i}") for i in range(vocab_size)]


class _StandInTokenizer:
    """What CTranslate2's loaders read from a tokenizer: the vocabulary and the names of EOS,
    UNK, PAD (and BOS: Qwen2's loader falls back to PAD)."""

    eos_token, unk_token, pad_token, bos_token = "</s>", "<unk>", "<pad>", None

    def __init__(self, names: list[str]):
        self._vocab = {name: i for i, name in enumerate(names)}

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)


def convert(hf_dir: str | Path, out_dir: str | Path, names: list[str]) -> Path:
    """Convert a save_pretrained directory (Marian, or a decoder-only LLM such as Qwen2) with
    CTranslate2's converter (float32)."""
    from ctranslate2.converters import TransformersConverter

    class _Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _StandInTokenizer(names)

    return Path(_Converter(str(hf_dir)).convert(str(out_dir), force=True))


class CT2Peer:
    """A CTranslate2 Translator over a converted model; `generate` takes and returns ids."""

    def __init__(self, model_dir: str | Path, names: list[str], compute_type: str, threads: int):
        import ctranslate2

        self.compute_type = compute_type
        self.names = names
        self.ids = {name: i for i, name in enumerate(names)}
        self.translator = ctranslate2.Translator(
            str(model_dir),
            device="cpu",
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=threads,
        )

    def generate(self, sources: np.ndarray, num_beams: int, new_tokens: int) -> np.ndarray:
        """(batch, new_tokens) ids: exactly `new_tokens` tokens per row (EOS suppressed until
        then, as `min_new_tokens` does on the other sides), the best hypothesis."""
        batch = [[self.names[int(i)] for i in row] for row in sources]
        results = self.translator.translate_batch(
            batch,
            beam_size=num_beams,
            max_decoding_length=new_tokens,
            min_decoding_length=new_tokens,
            max_batch_size=0,
        )
        rows = [[self.ids[token] for token in r.hypotheses[0]] for r in results]
        out = np.full((len(rows), new_tokens), -1, np.int64)
        for i, row in enumerate(rows):
            out[i, : min(len(row), new_tokens)] = row[:new_tokens]
        return out


class CT2GeneratorPeer:
    """A CTranslate2 Generator (decoder-only models) over a converted model; ids in and out."""

    def __init__(self, model_dir: str | Path, names: list[str], compute_type: str, threads: int):
        import ctranslate2

        self.compute_type = compute_type
        self.names = names
        self.generator = ctranslate2.Generator(
            str(model_dir),
            device="cpu",
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=threads,
        )

    def generate(self, prompts: list[list[int]], new_tokens: int) -> np.ndarray:
        """(batch, new_tokens) ids, greedy: each prompt (ragged, no padding) forwarded at once,
        then exactly `new_tokens` tokens (EOS suppressed until then, as `min_new_tokens` does
        on the other sides)."""
        results = self.generator.generate_batch(
            [[self.names[int(i)] for i in row] for row in prompts],
            max_length=new_tokens,
            min_length=new_tokens,
            sampling_topk=1,
            include_prompt_in_result=False,
            max_batch_size=0,
        )
        out = np.full((len(results), new_tokens), -1, np.int64)
        for i, r in enumerate(results):
            row = r.sequences_ids[0][:new_tokens]
            out[i, : len(row)] = row
        return out


COMPUTE_TYPES = ("float32", "int8")


def load_peers(
    hf_dir: str | Path, sizes: dict, threads: int, wanted: bool = True
) -> tuple[dict[str, CT2Peer], str | None]:
    """({"ct2_float32": peer, "ct2_int8": peer}, None), or ({}, the line saying why not).

    `hf_dir` is a save_pretrained Marian directory with the bench's `sizes`; the converted
    model goes into `hf_dir`/ct2 (the Translators load it into memory)."""
    why = None if wanted else "CTranslate2 left out (--no-ct2)"
    why = why or missing()
    if why:
        return {}, why
    names = token_names(sizes["vocab_size"], sizes["eos_token_id"], sizes["pad_token_id"])
    converted = convert(hf_dir, Path(hf_dir) / "ct2", names)
    peers = {f"ct2_{kind}": CT2Peer(converted, names, kind, threads) for kind in COMPUTE_TYPES}
    return peers, None


def agreement(reference: np.ndarray, new_tokens: np.ndarray) -> float:
    """Share of generated tokens equal to transformers' at the same position.

    `reference` is transformers' output for seq2seq (decoder start token, then the new tokens,
    the last one forced to EOS by opus-mt's forced_eos_token_id); `new_tokens` is CTranslate2's
    (no start token, no forced EOS). Compared: every new token but that forced last one.
    """
    ref = np.asarray(reference)[:, 1:]
    n = min(ref.shape[1], new_tokens.shape[1]) - 1
    return float(np.mean(ref[:, :n] == new_tokens[:, :n])) if n > 0 else 1.0


def cpu_info(cpuinfo: str | None = None) -> dict:
    """The CPU's model name, family/model numbers and which of VECTOR_FLAGS it has."""
    if cpuinfo is None:
        cpuinfo = ""
        with contextlib.suppress(OSError):
            cpuinfo = Path("/proc/cpuinfo").read_text()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    import platform

    return {
        "model_name": fields.get("model name") or platform.processor() or platform.machine(),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "cores": os.cpu_count(),
        "extensions": [flag for flag in VECTOR_FLAGS if flag in flags],
        "lacks": [flag for flag in VECTOR_FLAGS if flag not in flags],
    }


def describe_cpu(info: dict) -> str:
    """One line: `CPU: AMD EPYC (family 25 model 1), 2 cores; has avx avx2 fma; lacks ...`."""
    ident = f" (family {info['family']} model {info['model']})" if info.get("family") else ""
    has = " ".join(info["extensions"]) or "none of them"
    lacks = " ".join(info["lacks"]) or "nothing"
    return f"CPU: {info['model_name']}{ident}, {info['cores']} cores; has {has}; lacks {lacks}"
