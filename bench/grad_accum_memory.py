"""Memory of the compiled train step with gradient accumulation:
`python -m bench.grad_accum_memory [--accum 1 2 4] [--json]`.

Compiles (never runs) the project's train step (make_train_step: forward, label-smoothed loss,
backward, clip, AdamW; state donated, as train.py runs it) for the `reference` preset with
dropout 0.1 and a batch of 32 x (64 + 64) tokens, once per micro-batch count N, and prints
XLA's `memory_analysis()`: temp (activations and other scratch alive inside the step), and
argument / output sizes (the state and batch, the same for every N).
"""

from __future__ import annotations

import argparse
import json

import jax

from bench import setup
from flax_transformer.nn.kinds import model_for
from flax_transformer.training.optim import make_optimizer
from flax_transformer.training.state import create_train_state
from flax_transformer.training.steps import make_train_step


def step_memory(grad_accum: int, preset: str, batch_shape: tuple[int, int, int]) -> dict:
    cfg = setup.bench_config(preset)
    model = model_for(cfg, "transformer")
    optimizer = make_optimizer(
        setup.LEARNING_RATE, weight_decay=setup.WEIGHT_DECAY, clip_norm=setup.CLIP_NORM
    )
    state = jax.eval_shape(lambda: create_train_state(model, optimizer, seed=0))
    batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), setup.make_batch(cfg, *batch_shape)
    )
    step = make_train_step(model, optimizer, setup.LABEL_SMOOTHING, grad_accum=grad_accum)
    compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
    memory = compiled.memory_analysis()
    return {
        "grad_accum": grad_accum,
        "micro_batch": batch_shape[0] // grad_accum,
        "temp_bytes": int(memory.temp_size_in_bytes),
        "argument_bytes": int(memory.argument_size_in_bytes),
        "output_bytes": int(memory.output_size_in_bytes),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accum", type=int, nargs="+", default=[1, 2, 4], help="micro-batch counts")
    p.add_argument("--preset", default="reference")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    rows = [step_memory(n, args.preset, setup.REFERENCE_BATCH) for n in args.accum]
    if args.json:
        info = {
            "preset": args.preset,
            "batch": list(setup.REFERENCE_BATCH),
            "backend": jax.default_backend(),
        }
        print(json.dumps(info | {"rows": rows}, indent=2))
        return
    batch, src, tgt = setup.REFERENCE_BATCH
    print(f"{args.preset} preset, batch {batch} x ({src} + {tgt}) tokens, {jax.default_backend()}")
    print(f"{'N':>3} {'micro-batch':>11} {'temp MiB':>9} {'args MiB':>9}")
    for row in rows:
        print(
            f"{row['grad_accum']:>3} {row['micro_batch']:>11} "
            f"{row['temp_bytes'] / 2**20:>9.1f} {row['argument_bytes'] / 2**20:>9.1f}"
        )


if __name__ == "__main__":
    main()
