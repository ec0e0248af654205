"""Memory and time of `ftx hf import` / `ftx hf export` on a multi-GB bfloat16 checkpoint:
`python -m bench.hf_memory --family gpt2 [--gb 3] [--max-shard-size 1GB] [--json OUT]`.

Writes a synthetic bfloat16 checkpoint of at least `--gb` GB (random weights, std 0.02) of a
real model's shape straight with safetensors, sharded as transformers' save_pretrained shards
(huggingface_hub's split, `model-0000i-of-0000N.safetensors` + `model.safetensors.index.json`):
`--family gpt2` GPT-2 XL's shape (1600 wide, 48 layers: 1.56 B parameters, 3.1 GB), `--family
llama` Llama 3.2 3B's (3072 wide, 28 layers, 24 heads, 8 KV heads, tied: 3.2 B, 6.4 GB),
`--family phi3` Phi-3-mini's (3072 wide, 32 layers, fused projections, untied: 3.8 B, 7.6 GB). The
tensor names and shapes come from transformers' class for the config built on the meta device
(no weights are allocated), the tied copies left out as save_pretrained leaves them out. A
tiny word-level tokenizer goes along (a run needs one).

Then, each in its own subprocess, timed, its peak resident set size its ru_maxrss (read
in a small wrapper process, not in a fork of this one, which holds GBs):
1. `ftx hf import` of a tiny model of the same family (the Python + JAX + transformers +
   Orbax baseline of an import),
2. `ftx hf import CKPT --workdir RUN --dtype bfloat16` (the run keeps bfloat16 parameters),
3. `ftx hf export` of the tiny run (the baseline of an export),
4. `ftx hf export --workdir RUN --out OUT --max-shard-size ...`.
Prints a table and writes JSON (`--json`, default bench/results/hf_memory_<family>.json). The
target: peak RSS - its baseline <= 1.3 x the checkpoint's bytes. Every multi-GB file is deleted at
the end (`--keep` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# name: (transformers config class, settings of the real model, settings of the tiny baseline)
FAMILIES = {
    "gpt2": (
        "GPT2Config",
        dict(n_embd=1600, n_layer=48, n_head=25, n_positions=1024, vocab_size=50257),
        dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=50257),
    ),
    "llama": (
        "LlamaConfig",
        dict(
            hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
            num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128256,
            max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=8192,
            ),
            bos_token_id=128000, eos_token_id=128001,
        ),
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, vocab_size=128256, tie_word_embeddings=True,
            bos_token_id=128000, eos_token_id=128001,
        ),
    ),
    "phi3": (  # Phi-3-mini's shape: fused qkv_proj / gate_up_proj, split on import
        "Phi3Config",
        dict(
            hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
            max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
        ),
        dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=32064, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
        ),
    ),
}  # fmt: skip


LAYERS = {"gpt2": "n_layer", "llama": "num_hidden_layers", "phi3": "num_hidden_layers"}


def hf_config(family: str, tiny: bool, layers: int | None = None):
    """transformers' config object of the family's real (or tiny) shape, dtype bfloat16;
    `layers` overrides the real shape's layer count (a smaller smoke run)."""
    import transformers

    name, real, small = FAMILIES[family]
    settings = dict(small if tiny else real)
    if layers is not None and not tiny:
        settings[LAYERS[family]] = layers
    config = getattr(transformers, name)(**settings)
    config.dtype = "bfloat16"
    return config


def tensor_shapes(config) -> dict[str, tuple[int, ...]]:
    """{name: shape} save_pretrained writes for the config's causal LM (built on the meta
    device: nothing allocated), tied copies left out."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    if not tied and getattr(config, "tie_word_embeddings", False):
        tied = {"lm_head.weight"}
    state = model.state_dict()
    return {k: tuple(v.shape) for k, v in state.items() if k not in tied}


def write_tokenizer(path: Path, bos: int, eos: int) -> None:
    """A word-level tokenizer whose bos / eos are the config's ids (its vocabulary is those
    and a few words: enough for a run directory)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i + 1 for i in range(20)}, "<s>": bos, "</s>": eos}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(path)


def write_checkpoint(path: Path, config, max_shard_size: str, seed: int = 0) -> int:
    """A random bfloat16 checkpoint of `config`'s shape in `path`, sharded as save_pretrained
    shards it; returns its tensor bytes."""
    import ml_dtypes
    from huggingface_hub import split_state_dict_into_shards_factory
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    write_tokenizer(path, config.bos_token_id, config.eos_token_id)
    shapes = tensor_shapes(config)
    split = split_state_dict_into_shards_factory(
        shapes,
        get_storage_size=lambda shape: int(np.prod(shape)) * 2,
        filename_pattern="model{suffix}.safetensors",
        max_shard_size=max_shard_size,
    )
    rng = np.random.default_rng(seed)
    for filename, names in split.filename_to_tensors.items():
        shard = {}
        for name in names:
            values = rng.standard_normal(shapes[name], dtype=np.float32) * 0.02
            if name.endswith("bias") or "ln" in name or "norm" in name:
                values = values + (1.0 if name.endswith("weight") else 0.0)
            shard[name] = values.astype(ml_dtypes.bfloat16)
            del values
        save_file(shard, str(path / filename), metadata={"format": "pt"})
        del shard
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (path / "model.safetensors.index.json").write_text(
            json.dumps(index, indent=2, sort_keys=True) + "\n"
        )
    return int(split.metadata["total_size"])


# Runs the command in a fresh, small interpreter and prints its peak RSS (KiB): a child forked
# from the benchmark itself would start with the benchmark's pages mapped (it has just written
# GBs), and ru_maxrss would count them.
_WRAPPER = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(done.returncode)\n"
)


def measured(command: list[str]) -> dict:
    """Run `command` (from a small wrapper process); its wall seconds and peak RSS (MiB, its
    ru_maxrss); raises on a nonzero exit with its stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *command], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    peak_kib = int(done.stdout.split()[-1])
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak_kib / 1024, 1)}


def ftx(*args: str) -> list[str]:
    """The `ftx hf` command line of this checkout's interpreter."""
    return [sys.executable, "-m", "flax_transformer.cli", "hf", *args]


def cpu_name() -> str:
    """lscpu's model name (platform.processor() where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line
        )
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor()


def run(
    family: str, gb: float, max_shard_size: str, workdir: Path, keep: bool, layers=None
) -> dict:
    """Write the checkpoints, import and export them, and measure; the result as a dict."""
    config = hf_config(family, tiny=False, layers=layers)
    tiny, big = workdir / "tiny", workdir / "ckpt"
    write_checkpoint(tiny, hf_config(family, tiny=True), "50GB")
    started = time.perf_counter()
    nbytes = write_checkpoint(big, config, max_shard_size)
    written = time.perf_counter() - started
    if nbytes < gb * 1e9:
        raise SystemExit(f"the {family} checkpoint is {nbytes / 1e9:.2f} GB, under --gb {gb}")
    try:
        rows = {
            "baseline (tiny import)": measured(
                ftx("import", str(tiny), "--workdir", str(workdir / "tiny_run"), "--dtype",
                    "bfloat16")
            ),
            "import": measured(
                ftx("import", str(big), "--workdir", str(workdir / "run"), "--dtype", "bfloat16")
            ),
        }  # fmt: skip
        shutil.rmtree(big) if not keep else None  # the export's disk space
        rows["baseline (tiny export)"] = measured(
            ftx(
                "export", "--workdir", str(workdir / "tiny_run"), "--out", str(workdir / "tiny_out")
            )
        )
        rows["export"] = measured(
            ftx("export", "--workdir", str(workdir / "run"), "--out", str(workdir / "out"),
                "--max-shard-size", max_shard_size)
        )  # fmt: skip
        shards = sorted(p.name for p in (workdir / "out").glob("model*.safetensors"))
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for name, row in rows.items():  # each command against its own tiny run
        step = "export" if "export" in name else "import"
        baseline = rows[f"baseline (tiny {step})"]["peak_rss_mb"]
        row["over_baseline_x_checkpoint"] = round(
            (row["peak_rss_mb"] - baseline) * 2**20 / nbytes, 3
        )
    return {
        "family": family,
        "checkpoint_bytes": nbytes,
        "parameters": nbytes // 2,
        "max_shard_size": max_shard_size,
        "export_files": shards,
        "write_s": round(written, 1),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "rows": rows,
    }


def print_table(result: dict) -> None:
    """The result as a markdown table."""
    gb = result["checkpoint_bytes"] / 1e9
    print(f"{result['family']}: {gb:.2f} GB bfloat16 checkpoint, {result['cpu']}")
    print("| step | wall s | peak RSS MB | (peak - baseline) / checkpoint |")
    print("|---|---:|---:|---:|")
    for name, row in result["rows"].items():
        ratio = row["over_baseline_x_checkpoint"]
        print(f"| {name} | {row['wall_s']} | {row['peak_rss_mb']} | {ratio:.2f}x |")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=sorted(FAMILIES), default="gpt2")
    p.add_argument("--gb", type=float, default=3.0, help="the least checkpoint size, GB")
    p.add_argument("--max-shard-size", default="1GB", help="as save_pretrained takes it")
    p.add_argument("--layers", type=int, help="fewer layers than the real model (smoke runs)")
    p.add_argument("--dir", type=Path, help="where to write (default: a new temporary dir)")
    p.add_argument("--json", type=Path, help="default bench/results/hf_memory_<family>.json")
    p.add_argument("--keep", action="store_true", help="keep the files (they are GBs)")
    args = p.parse_args(argv)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="hf_memory_"))
    result = run(args.family, args.gb, args.max_shard_size, workdir, args.keep, args.layers)
    print_table(result)
    out = args.json or ROOT / "bench" / "results" / f"hf_memory_{args.family}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
