"""`python -m flax_transformer.train ...`: the training command (lives in cli/train.py)."""

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

from flax_transformer.cli.train import main  # noqa: E402, F401  (the import path of 0.2)
