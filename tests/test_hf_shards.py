"""Real sizes on tiny models: sharded checkpoints read and written as transformers does
(save_pretrained(max_shard_size=...) read identically; hf.save's shards read strictly by
from_pretrained), bfloat16 kept bit-exact, bad indexes named, and the memory of hf.load / hf.save
bounded (tracemalloc: numpy's buffers)."""

import json
import shutil
import tracemalloc

import jax
import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from flax_transformer import hf
from flax_transformer.hf.shards import (
    SAFETENSORS_INDEX,
    parse_shard_size,
    plan_shards,
    write_weights,
)
from flax_transformer.interop.safetensors_stream import LazyArray, open_safetensors
from flax_transformer.spec.tree_check import ConversionError

from . import hf_llms, hf_models

# GPT-2 (fused, transposed tensors), T5 (the head's tying read from the weights), Phi-3 (fused
# qkv_proj / gate_up_proj split on load) and Gemma 2 (offset norms, soft-capping) in the fast
# suite; Marian, BERT, Llama, Gemma and Gemma 3 in the slow pass. The decoder LLMs are the
# briefly trained cells of tests/hf_llms.py.
SLOW = ("marian", "bert", "llama_gqa", "gemma_mqa_tied", "gemma3_local_rope")
FAST = ("gpt2", "t5", "phi3_fused_longrope_partial", "gemma2_softcap_local_global")
CELLS = (*FAST, *(pytest.param(f, marks=pytest.mark.slow) for f in SLOW))
SHARD = "20KB"  # each tiny model in several shards


def _torch_model(family: str):
    import transformers

    if family in hf_llms.CELLS:
        return hf_llms.build(family)
    if family == "bert":
        return hf_models.build_encoder_only("bert_sequence")
    if family == "t5":
        config = transformers.T5Config(**hf_models.T5_SIZES, feed_forward_proj="gated-gelu")
        torch.manual_seed(0)
        return transformers.T5ForConditionalGeneration(config).eval()
    return hf_models.build(family, seed=3)


def _auto_class(family: str):
    import transformers

    if family in hf_llms.CELLS:
        return transformers.AutoModelForCausalLM
    return {
        "gpt2": transformers.AutoModelForCausalLM,
        "bert": transformers.AutoModelForSequenceClassification,
    }.get(family, transformers.AutoModelForSeq2SeqLM)


class Saved(dict):
    """{family: (its plain save, its sharded save, its bfloat16 sharded save)}, each family
    built and saved on first use (a slow family costs nothing in the fast suite)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.factory = tmp_path_factory

    def __missing__(self, family):
        model = _torch_model(family)
        root = self.factory.mktemp(family)
        model.save_pretrained(root / "plain")
        model.save_pretrained(root / "sharded", max_shard_size=SHARD)
        model.to(torch.bfloat16).save_pretrained(root / "bf16", max_shard_size=SHARD)
        self[family] = (root / "plain", root / "sharded", root / "bf16")
        return self[family]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return Saved(tmp_path_factory)


def _files_tensors(path):
    """{name: array} of every safetensors file in `path` (one file or shards)."""
    state = {}
    for file in sorted(path.glob("model*.safetensors")):
        state.update(load_file(str(file)))
    return state


def _leaves(model):
    return jax.tree_util.tree_leaves_with_path(model.variables)


@pytest.mark.parametrize("family", CELLS)
def test_transformers_shards_load_as_the_single_file(saved, family):
    plain, sharded, _ = saved[family]
    index = json.loads((sharded / SAFETENSORS_INDEX).read_text())
    assert len(set(index["weight_map"].values())) > 2  # the split happened
    one, many = hf.load(plain), hf.load(sharded)
    assert len(_leaves(one)) == len(_leaves(many))
    for (path, a), (_, b) in zip(_leaves(one), _leaves(many), strict=True):
        assert isinstance(b, jax.Array) and b.dtype == a.dtype, path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


@pytest.mark.parametrize("family", CELLS)
def test_hf_save_shards_are_read_strictly_by_transformers(saved, family, tmp_path):
    plain, _, _ = saved[family]
    hf.save(hf.load(plain), tmp_path, max_shard_size=SHARD)
    index = json.loads((tmp_path / SAFETENSORS_INDEX).read_text())
    files = sorted(p.name for p in tmp_path.glob("model*.safetensors"))
    count = len(files)
    assert count > 2 and not (tmp_path / "model.safetensors").exists()
    assert files == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    written = {}
    for name in files:
        tensors = load_file(str(tmp_path / name))
        assert {k for k, f in index["weight_map"].items() if f == name} == set(tensors)
        assert (tmp_path / name).stat().st_size <= parse_shard_size(SHARD) + 4096 or len(
            tensors
        ) == 1
        written.update(tensors)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in written.values())
    expected = load_file(str(plain / "model.safetensors"))
    assert sorted(written) == sorted(expected)
    for key, value in expected.items():
        assert written[key].dtype == value.dtype, key
        np.testing.assert_array_equal(written[key], value, err_msg=key)
    reloaded, info = _auto_class(family).from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # missing, unexpected, mismatched keys, errors
    theirs = reloaded.state_dict()
    for key, value in expected.items():
        np.testing.assert_array_equal(theirs[key].numpy(), value, err_msg=key)


@pytest.mark.parametrize("family", CELLS)
def test_bfloat16_loads_as_bfloat16_and_saves_bit_exact(saved, family, tmp_path):
    _, _, bf16 = saved[family]
    model = hf.load(bf16, dtype="bfloat16")
    assert model.config.param_dtype == "bfloat16"
    for path, leaf in _leaves(model):
        assert isinstance(leaf, jax.Array) and leaf.dtype == jax.numpy.bfloat16, path
    hf.save(model, tmp_path, max_shard_size=SHARD)
    before, after = _files_tensors(bf16), _files_tensors(tmp_path)
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        assert after[key].dtype == ml_dtypes.bfloat16, key
        np.testing.assert_array_equal(after[key].view(np.uint16), value.view(np.uint16), key)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    # The default is unchanged: float32 parameters, the bfloat16 values exactly.
    wide = hf.load(bf16)
    for (path, a), (_, b) in zip(_leaves(wide), _leaves(model), strict=True):
        assert a.dtype == np.float32, path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b).astype(np.float32))


@pytest.mark.slow
def test_a_soft_capped_bfloat16_checkpoint_gives_finite_capped_logits(saved):
    """Gemma 2's bfloat16 checkpoint run in bfloat16: finite logits, within the final cap
    (3.0), close to the float32 model's on the left-padded batch."""
    plain, _, bf16 = saved["gemma2_softcap_local_global"]
    ids, mask, positions = hf_llms.left_padded(np.random.default_rng(0))
    real = mask.astype(bool)
    model = hf.load(bf16, dtype="bfloat16")
    logits = model.forward(ids, mask, position_ids=positions)
    assert logits.dtype == jax.numpy.bfloat16
    logits = np.asarray(logits, np.float32)[real]
    assert np.all(np.isfinite(logits)) and np.max(np.abs(logits)) <= 3.0
    reference = np.asarray(hf.load(plain).forward(ids, mask, position_ids=positions))[real]
    assert np.max(np.abs(logits - reference)) < 0.05 * np.max(np.abs(reference))


def _copy(source, destination):
    shutil.copytree(source, destination)
    return destination


def _first_shard(path):
    weight_map = json.loads((path / SAFETENSORS_INDEX).read_text())["weight_map"]
    return weight_map, sorted(set(weight_map.values()))[0]


def test_a_missing_shard_is_named(saved, tmp_path):
    path = _copy(saved["gpt2"][1], tmp_path / "c")
    weight_map, shard = _first_shard(path)
    (path / shard).unlink()
    tensor = next(k for k, f in weight_map.items() if f == shard)
    with pytest.raises(ConversionError) as err:
        hf.load(path)
    message = str(err.value)
    assert f"{path / shard}: missing" in message and repr(tensor) in message
    assert "\n" not in message
    from flax_transformer.cli.hf import main

    assert main(["import", str(path), "--workdir", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_an_index_naming_a_tensor_its_shard_lacks(saved, tmp_path):
    path = _copy(saved["gpt2"][1], tmp_path / "c")
    weight_map, shard = _first_shard(path)
    tensors = load_file(str(path / shard))
    gone = sorted(tensors)[0]
    del tensors[gone]
    save_file(tensors, str(path / shard), metadata={"format": "pt"})
    with pytest.raises(ConversionError) as err:
        hf.load(path)
    assert f"{path / shard}: does not hold tensor {gone!r}, which the index maps to it" in str(
        err.value
    )


def test_a_shard_holding_a_tensor_the_index_does_not_name(saved, tmp_path):
    path = _copy(saved["gpt2"][1], tmp_path / "c")
    weight_map, shard = _first_shard(path)
    tensors = load_file(str(path / shard))
    tensors["transformer.extra.weight"] = np.zeros(3, np.float32)
    save_file(tensors, str(path / shard), metadata={"format": "pt"})
    with pytest.raises(ConversionError) as err:
        hf.load(path)
    assert (
        f"{path / shard}: holds tensor 'transformer.extra.weight', which the index does not name"
        in str(err.value)
    )
    # A tensor in the wrong shard is named with the shard the index says.
    del tensors["transformer.extra.weight"]
    moved = next(k for k, f in weight_map.items() if f != shard)
    tensors[moved] = np.zeros(3, np.float32)
    save_file(tensors, str(path / shard), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=f"holds tensor '{moved}', which the index maps to"):
        hf.load(path)


def test_a_bad_index_file_is_named(saved, tmp_path):
    path = _copy(saved["gpt2"][1], tmp_path / "c")
    (path / SAFETENSORS_INDEX).write_text('{"metadata": {}}')
    with pytest.raises(ConversionError, match="not a safetensors index"):
        hf.load(path)
    (path / SAFETENSORS_INDEX).write_text('{"weight_map": {"a": "../model.safetensors"}}')
    with pytest.raises(ConversionError, match="not a file name in the index's directory"):
        hf.load(path)


def test_max_shard_size_is_read_as_save_pretrained_reads_it():
    assert parse_shard_size("5GB") == 5 * 10**9
    assert parse_shard_size("1.5GB") == 1_500_000_000
    assert parse_shard_size("200MB") == parse_shard_size("200mb") == 200 * 10**6
    assert parse_shard_size(1234) == 1234
    for bad in ("5 gigs", "GB", "-1GB", 0, True, 1.5):
        with pytest.raises(ValueError, match="max_shard_size"):
            parse_shard_size(bad)


def test_the_split_is_huggingface_hubs():
    from huggingface_hub import split_state_dict_into_shards_factory

    sizes = dict(a=6, b=6, c=2, d=6, e=2, f=2, g=15, h=1)
    ours = plan_shards(sizes, 10)
    split = split_state_dict_into_shards_factory(
        sizes, get_storage_size=lambda n: n, filename_pattern="m{suffix}", max_shard_size=10
    )
    assert [list(names) for names in split.filename_to_tensors.values()] == ours


def test_stale_weights_are_replaced(saved, tmp_path):
    """Saving one file over shards (or shards over one file) leaves nothing stale behind."""
    plain, sharded, _ = saved["gpt2"]
    model = hf.load(plain)
    target = _copy(sharded, tmp_path / "out")
    hf.save(model, target)
    assert sorted(p.name for p in target.glob("model*")) == ["model.safetensors"]
    hf.save(model, target, max_shard_size=SHARD)
    assert not (target / "model.safetensors").exists()


def test_lazy_arrays_read_when_asked():
    reads = []

    def load():
        reads.append(1)
        return np.arange(12, dtype=np.float32).reshape(3, 4)

    lazy = LazyArray((3, 4), np.float32, load)
    derived = [lazy.T, lazy.transpose(1, 0), lazy.astype(np.float64), lazy.reshape(-1)]
    derived += lazy.split(2, axis=-1) + [LazyArray.concatenate([lazy, lazy], axis=0)]
    assert not reads
    base = load()
    expected = [base.T, base.T, base.astype(np.float64), base.reshape(-1)]
    expected += np.split(base, 2, axis=-1) + [np.concatenate([base, base], axis=0)]
    for got, want in zip(derived, expected, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), want)


def test_written_files_are_safetensors_files(tmp_path):
    state = {
        "b": np.arange(6, dtype=np.float32).reshape(2, 3),
        "a": np.arange(5).astype(ml_dtypes.bfloat16),
        "c": LazyArray((2,), np.float64, lambda: np.array([1.5, -2.0])),
    }
    write_weights(tmp_path, state, metadata={"format": "pt"})
    back = load_file(str(tmp_path / "model.safetensors"))
    lazy, metadata = open_safetensors(tmp_path / "model.safetensors")
    assert metadata == {"format": "pt"}
    for key, value in state.items():
        np.testing.assert_array_equal(back[key], np.asarray(value))
        np.testing.assert_array_equal(np.asarray(lazy[key]), np.asarray(value))


def test_import_in_bfloat16_and_export_in_shards(saved, tmp_path):
    """ftx hf import --dtype bfloat16 of a sharded bfloat16 checkpoint keeps bfloat16
    parameters in the run; ftx hf export --max-shard-size writes them back bit-exact, in
    shards."""
    from flax_transformer.cli.hf import main
    from flax_transformer.runs import run_dir

    _, _, bf16 = saved["gpt2"]
    source = _copy(bf16, tmp_path / "source")
    hf_models.marian_tokenizer().save_pretrained(source)  # a run needs a tokenizer
    run = tmp_path / "run"
    assert main(["import", str(source), "--workdir", str(run), "--dtype", "bfloat16"]) == 0
    assert run_dir.read_config(run).param_dtype == "bfloat16"
    out = tmp_path / "out"
    assert main(["export", "--workdir", str(run), "--out", str(out), "--max-shard-size",
                 "20000"]) == 0  # fmt: skip
    assert (out / SAFETENSORS_INDEX).exists()
    before, after = _files_tensors(source), _files_tensors(out)
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        assert after[key].dtype == ml_dtypes.bfloat16, key
        np.testing.assert_array_equal(after[key].view(np.uint16), value.view(np.uint16), key)
    with pytest.raises(SystemExit):  # argparse: exit 2, the flag named
        main(["export", "--workdir", str(run), "--out", str(tmp_path / "o2"),
              "--max-shard-size", "5 gigs"])  # fmt: skip


# ----------------------------------------------------------------------------- memory
@pytest.fixture(scope="module")
def mid_sized(tmp_path_factory):
    """A GPT-2 of 5.3 M parameters (21 MB float32) whose largest tensor is 1 MB."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=256, n_layer=6, n_head=4, n_positions=64, vocab_size=2000, bos_token_id=1999,
        eos_token_id=1999,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("mid")
    GPT2LMHeadModel(config).save_pretrained(path, max_shard_size="5MB")
    return path, sum(v.nbytes for v in _files_tensors(path).values())


def test_load_and_save_hold_one_model_of_numpy_buffers(mid_sized, tmp_path):
    """hf.load's numpy peak stays under 1.3x the checkpoint (reading it whole and converting
    would be 2x or more); hf.save's under a quarter (one tensor at a time beside the params)."""
    path, nbytes = mid_sized
    tracemalloc.start()
    try:
        model = hf.load(path)
        loaded = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        hf.save(model, tmp_path, max_shard_size="5MB")
        saved = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert loaded < 1.3 * nbytes, (loaded, nbytes)
    assert saved < 0.25 * nbytes, (saved, nbytes)
