"""`python -m flax_transformer.train ...`: the training command (lives in cli/train.py)."""

from flax_transformer.cli.process import exit_process

if __name__ == "__main__":  # before JAX loads: keep the step's memory mapped (host_memory.py)
    from flax_transformer.training.host_memory import reexec_with_tuned_malloc

    reexec_with_tuned_malloc()

from flax_transformer.cli.train import main

if __name__ == "__main__":
    exit_process(main())
