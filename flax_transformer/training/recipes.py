"""Named training recipes: a set of flag values that `train.py --recipe NAME` starts from (flags
given on the command line, and --run-config, override them; run.json records the result).

`paper-base` is the base model recipe of "Attention Is All You Need" (section 5):
- the base model: d_model 512, 8 heads, 6+6 layers, d_ff 2048, dropout 0.1 (`--preset
  paper_base`), a shared BPE vocabulary of about 37000 tokens;
- Adam with beta1 0.9, beta2 0.98, eps 1e-9 (training/optim.py's constants), no weight decay
  and no gradient clipping (the paper mentions neither);
- lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) with warmup 4000: the project's
  inverse_sqrt schedule with its peak d_model^-0.5 * warmup^-0.5 (about 7.0e-4) at step 4000;
- label smoothing 0.1;
- batches of about 25000 source and 25000 target tokens (`--batch-tokens 25000`; add
  `--grad-accum N` where one device cannot hold them: the same update in N micro-batches);
- 100000 steps, a checkpoint every 1000 steps, the last 5 kept: the paper scored the average
  of the last 5 checkpoints with beam 4 and length penalty 0.6, which is `ftx score
  --average-last 5 --beam 4 --alpha 0.6` (SCORE_FLAGS).
"""

from __future__ import annotations

from typing import Any

PAPER_D_MODEL, PAPER_WARMUP = 512, 4000

RECIPES: dict[str, dict[str, Any]] = {
    "paper-base": {
        "preset": "paper_base",
        "tokenizer": "bpe",
        "bpe_vocab_size": 37000,
        "steps": 100000,
        "batch_tokens": 25000,
        "lr": PAPER_D_MODEL**-0.5 * PAPER_WARMUP**-0.5,
        "warmup": PAPER_WARMUP,
        "schedule": "inverse_sqrt",
        "label_smoothing": 0.1,
        "weight_decay": 0.0,
        "clip_norm": 0.0,
        "save_every": 1000,
        "keep_checkpoints": 5,
        "eval_every": 1000,
    },
}
# How the paper scored a recipe's run (ftx score flags).
SCORE_FLAGS: dict[str, list[str]] = {
    "paper-base": ["--average-last", "5", "--beam", "4", "--alpha", "0.6"],
}
