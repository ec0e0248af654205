"""int8 against float32 on a trained run, both frameworks, side by side in one process.

    python -m bench.export_int8 RUN_DIR --json OUT.json [--rounds 3]

RUN_DIR is a train.py workdir of a built-in task (the default run: `python train.py --workdir
RUN_DIR`); its held-out set is rebuilt from run.json exactly as train.py built it. Five ways to
greedy-decode it:
- flax_float32: `decoding.generate` (KV-cached jitted while_loop) with the run's weights;
- flax_int8: the same with `export.int8` weights (int8 matrices, per-channel scales, dequantised
  inside the jitted loop);
- torch_float32: the PyTorch twin with the converted weights, recomputing the decoder over the
  prefix at every step (torch_reference has no KV cache), `export.torch_int8.greedy_torch`;
- torch_int8: the same loop on the twin after `quantize_dynamic(model, {nn.Linear}, qint8)`;
- torch_int8_torchscript: the exported TorchScript file (`--format torch-int8`), loaded back.
For each: exact match and sacrebleu BLEU against the references (as train.py scores them), and
decode tokens/s = generated tokens (up to and including EOS) / seconds over the whole set,
the median of --rounds interleaved rounds after one untimed warm-up round (compilation); torch
runs with --torch-threads threads (default 1), XLA with its own defaults.
Sizes: the Flax params tree (float32 vs int8 + scales), the torch state dicts as torch.save
writes them, and forward.stablehlo exported with and without --int8. The machine load
(/proc/loadavg) is recorded before and after.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def held_out_set(run_dir: Path, run, config):
    """The validation Dataset train.py evaluated, rebuilt from run.json's flags."""
    from flax_transformer.data.pipeline import encode_pairs, generate_task, held_out
    from flax_transformer.training.options import DataOptions

    args = json.loads((run_dir / "run.json").read_text())["args"]
    if args.get("train_tsv") or args.get("lm_text"):
        raise SystemExit("error: this bench rebuilds the held-out set of a built-in task run")
    task = args.get("task") or DataOptions.task
    lengths = (args["task_min_len"], args["task_max_len"])
    train = generate_task(task, args["task_train_size"], args["seed"], *lengths)
    valid = held_out(
        generate_task(task, args["task_valid_size"], args["seed"] + 1_000_003, *lengths), train
    )
    return encode_pairs(valid, run.tokenizer, config.max_len, args.get("on_long", "skip"))


def decode_all(decode_batch, batches) -> list[np.ndarray]:
    return [np.asarray(decode_batch(batch["src"], batch["src"].shape[1])) for _, batch in batches]


def score(outputs, batches, dataset, tokenizer, bleu_tokenize: str) -> dict:
    import sacrebleu

    from flax_transformer.training.evaluation import cut_at_eos

    hyps, refs, generated = [], [], 0
    for out, (indices, _) in zip(outputs, batches, strict=True):
        for row, i in enumerate(indices):
            ids = cut_at_eos(out[row], tokenizer.eos_id)
            generated += min(len(ids) + 1, out.shape[1])  # EOS counts when it was emitted
            hyps.append(tokenizer.decode(ids))
            refs.append(tokenizer.decode(dataset.tgt_out[i]))
    exact = float(np.mean([h == r for h, r in zip(hyps, refs, strict=True)]))
    bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize=bleu_tokenize).score
    return {"exact_match": exact, "bleu": float(bleu), "generated_tokens": generated}


def torch_bytes(module) -> int:
    import torch

    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return buffer.tell()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch.set_num_threads (1: on the shared 2-core machine, 2 threads measured 20x "
        "slower, its OpenMP threads waiting for a busy core)",
    )
    args = parser.parse_args(argv)

    import jax
    import torch

    from flax_transformer.cli.export import main as export_main
    from flax_transformer.data.pipeline import eval_batches
    from flax_transformer.decoding import Greedy, generate
    from flax_transformer.export.int8 import int8_model, quantize_variables, tree_nbytes
    from flax_transformer.export.torch_int8 import greedy_torch, load_torch_int8, quantize_twin
    from flax_transformer.export.torch_twin import torch_twin
    from flax_transformer.runs.load import load_run

    torch.set_num_threads(args.torch_threads)
    load_before = loadavg()
    run = load_run(args.run_dir)
    cfg, tok = run.config, run.tokenizer
    dataset = held_out_set(args.run_dir, run, cfg)
    batches = eval_batches(dataset, args.batch_size, cfg.max_len, tok.pad_id)
    quantised = quantize_variables(run.params)
    twin = torch_twin(run)
    twin_int8 = quantize_twin(twin)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        assert (
            export_main([str(args.run_dir), "--format", "torch-int8", "--out", str(tmp / "t")]) == 0
        )
        scripted, _ = load_torch_int8(tmp / "t")
        hlo = {}
        for name, extra in (("float32", []), ("int8", ["--int8"])):
            out = tmp / f"hlo_{name}"
            assert (
                export_main([str(args.run_dir), "--format", "stablehlo", "--out", str(out), *extra])
                == 0
            )
            hlo[name] = (out / "forward.stablehlo").stat().st_size

    def flax_decoder(model, variables):
        def decode(src, length):
            return generate(
                model, variables, src, Greedy(), max_new_tokens=min(length, cfg.max_len),
                bos_id=tok.bos_id, eos_id=tok.eos_id,
            )  # fmt: skip

        return decode

    def torch_decoder(model):
        ids = dict(kind=run.model_kind, bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=cfg.pad_id)
        return lambda src, length: greedy_torch(
            model, src, max_new_tokens=min(length, cfg.max_len), **ids
        )

    decoders = {
        "flax_float32": flax_decoder(run.model, run.params),
        "flax_int8": flax_decoder(int8_model(run.model), quantised),
        "torch_float32": torch_decoder(twin),
        "torch_int8": torch_decoder(twin_int8),
        "torch_int8_torchscript": torch_decoder(scripted),
    }
    outputs = {name: decode_all(fn, batches) for name, fn in decoders.items()}  # warm-up
    times = {name: [] for name in decoders}
    for _ in range(args.rounds):  # interleaved: a noisy neighbour slows every variant alike
        for name, fn in decoders.items():
            start = time.perf_counter()
            again = decode_all(fn, batches)
            times[name].append(time.perf_counter() - start)
            assert all(np.array_equal(a, b) for a, b in zip(again, outputs[name], strict=True))
    results = {}
    for name in decoders:
        scores = score(outputs[name], batches, dataset, tok, "char")
        seconds = statistics.median(times[name])
        results[name] = {
            **scores,
            "seconds_median": seconds,
            "seconds_all": times[name],
            "tokens_per_s": scores["generated_tokens"] / seconds,
        }
    same = lambda a, b: all(
        np.array_equal(x, y) for x, y in zip(outputs[a], outputs[b], strict=True)
    )  # noqa: E731
    report = {
        "run_dir": str(args.run_dir),
        "step": run.step,
        "examples": len(dataset),
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "results": results,
        "identical_tokens": {
            "flax_int8_vs_flax_float32": same("flax_int8", "flax_float32"),
            "torch_float32_vs_flax_float32": same("torch_float32", "flax_float32"),
            "torch_int8_vs_flax_float32": same("torch_int8", "flax_float32"),
            "torchscript_vs_torch_int8": same("torch_int8_torchscript", "torch_int8"),
        },
        "bytes": {
            "flax_params_float32": tree_nbytes(run.params),
            "flax_params_int8": tree_nbytes(quantised),
            "torch_state_dict_float32": torch_bytes(twin),
            "torch_state_dict_int8": torch_bytes(twin_int8),
            "forward_stablehlo_float32": hlo["float32"],
            "forward_stablehlo_int8": hlo["int8"],
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "jax": jax.__version__,
            "torch": torch.__version__,
            "loadavg_before": load_before,
            "loadavg_after": loadavg(),
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    for name, r in results.items():
        print(
            f"{name:24s} exact {r['exact_match']:.4f}  BLEU {r['bleu']:6.2f}  "
            f"{r['tokens_per_s']:8.0f} tok/s"
        )
    print(json.dumps(report["bytes"]), json.dumps(report["identical_tokens"]))
    print("load before/after:", report["machine"]["loadavg_before"], "/", loadavg())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
