"""python -m flax_transformer.hf import HF_DIR RUN_DIR | export RUN_DIR HF_DIR

import: a directory written by transformers' save_pretrained (marian, bart, mbart, gpt2, with
its tokenizer) -> a train.py run directory that `python -m flax_transformer.generate --workdir
RUN_DIR` decodes with and `train.py --init-from RUN_DIR` fine-tunes from.
export: such a run (or one fine-tuned from it) -> a save_pretrained directory.
Exit status: 0 done, 1 the input cannot be converted (the message says why), 2 bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flax_transformer.hf",
        description="Hugging Face checkpoints as train.py run directories, and back.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help="save_pretrained directory -> run directory")
    imp.add_argument("hf_dir", help="directory written by save_pretrained (with its tokenizer)")
    imp.add_argument("run_dir", help="the run directory to create (new or empty)")
    exp = commands.add_parser("export", help="run directory -> save_pretrained directory")
    exp.add_argument("run_dir", help="a run made by `import`, or fine-tuned from one")
    exp.add_argument("hf_dir", help="where to write config.json, model.safetensors, ...")
    exp.add_argument(
        "--checkpoint",
        metavar="last|best|STEP",
        help="which checkpoint (default: best when the run kept one, else last)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from flax_transformer.hf.run_dir import export_run, import_run
    from flax_transformer.spec.tree_check import ConversionError

    try:
        if args.command == "import":
            out = import_run(args.hf_dir, args.run_dir)
        else:
            out = export_run(args.run_dir, args.hf_dir, args.checkpoint)
    except (ValueError, ConversionError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"command": args.command, "output": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
