"""`ftx convert IN --out OUT` (also `python -m flax_transformer.convert`): a torch_reference
weight file to a Flax safetensors file, or back; the direction follows the input. The
conversion itself is interop/convert.py."""

from __future__ import annotations

import argparse
import sys

from flax_transformer.cli.output import add_json_flag, check_json_path, emit
from flax_transformer.files.atomic_io import OutputPathError, check_output_path
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.files.space import is_out_of_space
from flax_transformer.interop.convert import (
    FORMAT_TORCH,
    flax_file_params,
    flax_to_torch_state,
    load_weights,
    save_flax_params,
    save_torch_state,
    torch_state_to_flax,
)
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import MODEL_KINDS, current_name
from flax_transformer.spec.naming import flatten_params
from flax_transformer.spec.tree_check import ConversionError


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m flax_transformer.convert` / `ftx convert`: convert torch weights
    to Flax or back (the direction follows the input), say what was converted (--json: as
    JSON). Exit status 2 for bad flags or unreadable / inconsistent weights, else 0."""
    parser = argparse.ArgumentParser(
        prog="ftx convert",
        description="Convert a torch_reference weight file (.safetensors or .pt) to a Flax "
        "safetensors file, or a Flax file back to torch keys. The direction follows the input.",
    )
    parser.add_argument("input", help="torch .safetensors/.pt or Flax .safetensors file")
    parser.add_argument("output", nargs="?", help="old spelling of --out")
    parser.add_argument(
        "--out", "--output", dest="out", help="where to write the converted .safetensors file"
    )
    parser.add_argument("--config", help="TransformerConfig JSON (needed for .pt input)")
    parser.add_argument(
        "--model", choices=MODEL_KINDS, type=current_name, help="default: from the file / its keys"
    )
    add_json_flag(parser)
    parser.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="convert weights holding nan/inf (refused by default: such a model computes nan)",
    )
    args = parser.parse_args(argv)
    if (args.output is None) == (args.out is None):
        parser.error("give the output file once: --out OUT (or the old positional OUT)")
    args.output = args.output if args.output is not None else args.out
    try:  # before reading anything: the output's directory exists and the output is no input
        check_output_path(args.output, inputs=(args.input, ("--config file", args.config)))
    except OutputPathError as err:
        parser.error(str(err))
    inputs = [("input", args.input), ("--config file", args.config), ("output", args.output)]
    check_json_path(parser, args.json, inputs)
    try:
        config = TransformerConfig.load(args.config) if args.config else None
        fmt, tensors, config, model = load_weights(
            args.input, config, args.model, allow_nonfinite=args.allow_nonfinite
        )
        if fmt == FORMAT_TORCH:
            params = torch_state_to_flax(tensors, config, model)
            save_flax_params(args.output, params, config, model)
            direction = "torch -> flax"
        else:
            params = flax_file_params(tensors, config, model)
            save_torch_state(args.output, flax_to_torch_state(params), config, model)
            direction = "flax -> torch"
    except (ConversionError, ValueError, OSError) as err:  # bad input: exit status 2
        if is_out_of_space(err):
            raise  # a failed write, not bad input: one_line_failures says it (exit 1)
        print(f"error: {err}", file=sys.stderr)
        return 2
    count = len(flatten_params(params))
    result = {"converted": direction, "model": model, "tensors": count, "output": str(args.output)}
    emit(result, [f"converted {direction}: {count} tensors of a {model} model -> {args.output}"],
         args.json)  # fmt: skip
    return 0
