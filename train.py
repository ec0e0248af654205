"""Train a Transformer with JAX/Flax: `python train.py` learns the built-in `reverse` task.

  python train.py                                  # reverse random strings, ~2 min on a CPU
  python train.py --task sort --steps 3000
  python train.py --train-tsv train.tsv --valid-tsv valid.tsv --workdir runs/mt
  python train.py --lm-text book.txt               # decoder-only language model
  python train.py --resume                         # continue the run in --workdir

A thin wrapper: the command lives in the package (flax_transformer/cli/train.py; also
`ftx train` and `python -m flax_transformer.train`). `import train; train.main(argv,
hooks=[...])` keeps working, and so do the helpers the old file offered (train.parse_args, ...).
"""

if __name__ == "__main__":
    import signal  # built in: no time passes before the next line

    # Held until the command can answer them with its one line (interrupt_exits_at_once).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    from flax_transformer.files.interruptions import interrupt_exits_at_once

    with interrupt_exits_at_once():  # until the command starts (cli/process.py)
        # Before JAX loads: keep the step's memory mapped (host_memory.py).
        from flax_transformer.training.host_memory import reexec_with_tuned_malloc

        reexec_with_tuned_malloc()
        from flax_transformer.cli.process import run_command_and_exit

    run_command_and_exit("flax_transformer.cli.train")

from flax_transformer.cli.train import *  # noqa: E402, F403  (train.parse_args etc. as before)
from flax_transformer.cli.train import main  # noqa: E402, F401
