"""Paths documented in an earlier release keep working for one release: each name resolves to
the very object at its new home, with a DeprecationWarning that names the new home."""

from __future__ import annotations

import importlib
import warnings

import pytest

MOVED = [
    # (old module, a name it offered, the new home)
    ("flax_transformer.spec.atomic_io", "atomic_write_text", "flax_transformer.files.atomic_io"),
    ("flax_transformer.spec.text_lines", "decode_line", "flax_transformer.files.text_lines"),
    ("flax_transformer.interop.hf_config", "hf_to_config", "flax_transformer.hf.config"),
    ("flax_transformer.interop.hf_weights", "hf_state_to_params", "flax_transformer.hf.weights"),
    ("flax_transformer.interop.hf_checkpoint", "read_json", "flax_transformer.hf.checkpoint"),
    ("flax_transformer.training.hf_tokenizer", "HFTokenizer", "flax_transformer.hf.tokenizer"),
    # the data pipeline left training/ for data/ (0.3)
    ("flax_transformer.training.data", "read_tsv", "flax_transformer.data.pipeline"),
    ("flax_transformer.training.corpus", "scan_corpus", "flax_transformer.data.corpus"),
    ("flax_transformer.training.packing", "pack_examples", "flax_transformer.data.packing"),
    (
        "flax_transformer.training.token_batches",
        "plan_token_batches",
        "flax_transformer.data.token_batches",
    ),
    ("flax_transformer.training.token_cache", "build_cache", "flax_transformer.data.token_cache"),
    ("flax_transformer.training.tokenizer", "load_tokenizer", "flax_transformer.data.tokenizer"),
    # the commands left the library rooms for cli/ (0.3)
    ("flax_transformer.decoding.cli", "main", "flax_transformer.cli.generate"),
    ("flax_transformer.decoding.cli", "read_lines", "flax_transformer.cli.generate"),
    ("flax_transformer.export.cli", "parse_args", "flax_transformer.cli.export"),
    ("flax_transformer.parity.cli", "run_cli", "flax_transformer.cli.parity"),
    ("flax_transformer.hf.__main__", "parse_args", "flax_transformer.cli.hf"),
    ("flax_transformer.hf.run_dir", "import_run", "flax_transformer.runs.hf_convert"),
    ("flax_transformer.interop.convert", "main", "flax_transformer.cli.convert"),
    ("flax_transformer.launch", "parse_args", "flax_transformer.cli.launch"),
    ("flax_transformer.demo", "parse_args", "flax_transformer.cli.demo"),
    # the run directory, loading a run and the Hugging Face conversions left training/ for the
    # application layer, runs/ (0.3); the loop's own files are training/run_files.py's
    ("flax_transformer.training.run_dir", "read_run_json", "flax_transformer.runs.run_dir"),
    ("flax_transformer.training.run_dir", "write_weights", "flax_transformer.runs.run_dir"),
    ("flax_transformer.training.run", "open_run", "flax_transformer.runs.load"),
    ("flax_transformer.training.run", "checkpoint_steps", "flax_transformer.runs.load"),
    ("flax_transformer.training.hf_runs", "export_run", "flax_transformer.runs.hf_convert"),
    # paths of the release before the subpackage layout
    ("flax_transformer.convert", "torch_state_to_flax", "flax_transformer.interop.convert"),
    ("flax_transformer.convert", "save_torch_state", "flax_transformer.interop.convert"),
    ("flax_transformer.numerics", "assert_close", "flax_transformer.spec.numerics"),
    ("flax_transformer.decode", "greedy_decode", "flax_transformer.decoding"),
    ("flax_transformer.decode", "beam_search", "flax_transformer.decoding"),
    ("flax_transformer.sharding", "make_mesh", "flax_transformer.training.sharding"),
    # the native kernels, moved into their own room (kernels/)
    ("flax_transformer.nn.int8_amx", "pack", "flax_transformer.kernels.int8_amx"),
    ("flax_transformer.nn.f32_packed", "product", "flax_transformer.kernels.f32_packed"),
    ("flax_transformer.decoding.beam_reorder", "reorder", "flax_transformer.kernels.beam_reorder"),
    ("flax_transformer.nn.native_build", "cpu_flags", "flax_transformer.kernels.cpu"),
    ("flax_transformer.nn.native_build", "cache_dir", "flax_transformer.kernels.cache"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_old_path_resolves_with_a_deprecation_warning(old, name, new):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")) as caught:
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    assert any(name in str(w.message) for w in caught)


def test_from_import_of_an_old_path_warns():
    with pytest.warns(DeprecationWarning, match=r"flax_transformer\.spec\.numerics"):
        from flax_transformer.numerics import error_stats  # noqa: F401


def test_a_private_name_on_a_moved_module_is_an_attribute_error_without_a_warning():
    """Tools probe modules for private names (pytest asks every module in a test's namespace
    for `_mock_name`): a moved module answers no, silently, instead of warning."""
    module = importlib.import_module("flax_transformer.decoding.cli")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert getattr(module, "_mock_name", None) is None


def test_an_unknown_name_on_an_old_path_is_an_attribute_error():
    module = importlib.import_module("flax_transformer.numerics")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(AttributeError, match="nope"):
            module.nope  # noqa: B018


def test_the_kind_has_one_name_and_old_files_still_read():
    from flax_transformer.spec.kinds import MODEL_KINDS, check_kind

    assert MODEL_KINDS == ("seq2seq", "lm", "encoder")
    assert check_kind("transformer") == "seq2seq"  # what runs and files before 0.2 recorded


def test_a_weight_file_of_the_old_kind_name_loads_as_seq2seq(tmp_path):
    import jax
    import numpy as np

    from flax_transformer import Transformer, preset
    from flax_transformer.interop.convert import load_weights, save_flax_params

    config = preset("tiny")
    src = np.ones((1, 3), np.int32)
    params = Transformer(config).init(jax.random.key(0), src, src)["params"]
    path = tmp_path / "old.safetensors"
    save_flax_params(path, params, config, model="transformer")  # as 0.1 wrote it
    assert load_weights(path)[3] == "seq2seq"
