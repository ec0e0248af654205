"""The command line: the installed `ftx` command and its subcommands, and the flag helpers every
command shares (`flags.py`)."""
