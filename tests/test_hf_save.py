"""hf.save: a directory transformers loads with no missing or unexpected keys and the same
logits; HF dir -> Flax -> HF dir is bit-exact per tensor; bad input gets one clear error."""

import json
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from flax_transformer import hf
from flax_transformer.hf.config import UnsupportedConfigError
from flax_transformer.spec.numerics import assert_close
from flax_transformer.spec.tree_check import ConversionError

from . import hf_models

FAMILIES = ("marian", "bart", "gpt2")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for model_type in FAMILIES:
        model = hf_models.build(model_type, seed=1)
        path = tmp_path_factory.mktemp(model_type)
        out[model_type] = hf_models.save(model, path, tokenizer=model_type == "marian")
    return out


@pytest.mark.parametrize("model_type", FAMILIES)
def test_round_trip_is_bit_exact_per_tensor(saved, model_type, tmp_path):
    hf.save(hf.load(saved[model_type]), tmp_path)
    before = load_file(str(saved[model_type] / "model.safetensors"))
    after = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        assert after[key].dtype == value.dtype, key
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    assert json.loads((tmp_path / "generation_config.json").read_text()) == json.loads(
        (saved[model_type] / "generation_config.json").read_text()
    )


@pytest.mark.parametrize("model_type", FAMILIES)
def test_transformers_loads_the_saved_model_strictly_with_the_flax_logits(
    saved, model_type, tmp_path
):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    model = hf.load(saved[model_type])
    # Changed weights, so the saved file can only come from the Flax side's values.
    leaves, tree = jax.tree.flatten(model.variables)
    rng = np.random.default_rng(5)
    changed = [np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(x.dtype) for x in leaves]
    model.variables = jax.tree.unflatten(tree, changed)
    hf.save(model, tmp_path)
    auto = AutoModelForCausalLM if model_type == "gpt2" else AutoModelForSeq2SeqLM
    reloaded, info = auto.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # missing, unexpected, mismatched keys, errors
    reread = hf.load(tmp_path)  # the file holds exactly the changed weights
    for a, b in zip(jax.tree.leaves(reread.variables), changed, strict=True):
        np.testing.assert_array_equal(a, b)
    if model_type == "marian":  # logits (the other families' follow from test_hf_load's parity)
        flax_logits, hf_logits = hf_models.logits_pair(
            model_type, reloaded.eval(), tmp_path, "float32"
        )
        assert_close(flax_logits, hf_logits, rtol=1e-5, what=f"{model_type} saved logits")
        assert (tmp_path / "tokenizer.json").exists()  # the tokenizer files went along


def copy_dir(source, destination, skip=()):
    destination.mkdir(exist_ok=True)
    for path in source.iterdir():
        if path.name not in skip:
            shutil.copyfile(path, destination / path.name)
    return destination


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_unsupported_model_type(saved, tmp_path):
    path = copy_dir(saved["bart"], tmp_path)
    edit_config(path, model_type="pegasus")
    with pytest.raises(UnsupportedConfigError, match=r"model_type 'pegasus' is not supported"):
        hf.load(path)


def test_a_config_without_a_required_option(saved, tmp_path):
    path = copy_dir(saved["gpt2"], tmp_path)
    config = json.loads((path / "config.json").read_text())
    del config["n_embd"], config["n_head"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match="gpt2 config lacks n_embd, n_head"):
        hf.load(path)


def test_unsupported_options_are_named_in_one_error(saved, tmp_path):
    path = copy_dir(saved["bart"], tmp_path)
    edit_config(path, normalize_before=True, decoder_ffn_dim=64, activation_function="tanh")
    with pytest.raises(UnsupportedConfigError) as err:
        hf.load(path)
    message = str(err.value)
    assert str(path / "config.json") in message
    for named in ("normalize_before=True", "decoder_ffn_dim=64", "activation_function='tanh'"):
        assert named in message


def test_missing_mis_shaped_and_unexpected_weights_are_named_together(saved, tmp_path):
    path = copy_dir(saved["marian"], tmp_path, skip=("model.safetensors",))
    state = load_file(str(saved["marian"] / "model.safetensors"))
    del state["model.encoder.layers.1.fc1.weight"]
    state["model.decoder.layers.0.fc2.weight"] = state["model.decoder.layers.0.fc2.weight"].T
    state["model.encoder.extra.weight"] = np.zeros(3, np.float32)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConversionError) as err:
        hf.load(path)
    message = str(err.value)
    assert str(path / "model.safetensors") in message and "3 problem(s)" in message
    assert "missing tensor 'model.encoder.layers.1.fc1.weight' (expected shape (40, 24))" in message
    assert (
        "shape mismatch for 'model.decoder.layers.0.fc2.weight': expected (24, 40), found (40, 24)"
        in message
    )
    assert "unexpected tensor 'model.encoder.extra.weight'" in message


def test_a_directory_without_weights(saved, tmp_path):
    path = copy_dir(saved["gpt2"], tmp_path, skip=("model.safetensors",))
    with pytest.raises(ConversionError, match=r"no weights \(expected model.safetensors"):
        hf.load(path)
    with pytest.raises(ValueError, match="not a directory"):
        hf.load(tmp_path / "nothing")
    (path / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json"):
        hf.load(path)


def test_marian_position_table_in_an_old_checkpoint_is_checked(saved, tmp_path):
    """Older Marian files may hold the sinusoid tables: the right ones are accepted, a trained
    one refused (transformers would load it; this model has no place for it)."""
    path = copy_dir(saved["marian"], tmp_path, skip=("model.safetensors",))
    state = load_file(str(saved["marian"] / "model.safetensors"))
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    table = MarianSinusoidalPositionalEmbedding(48, 24)
    state["model.encoder.embed_positions.weight"] = table.create_weight().numpy()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    hf.load(path)
    state["model.decoder.embed_positions.weight"] = table.create_weight().numpy() + 1e-3
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="model.decoder.embed_positions.weight is not"):
        hf.load(path)


def test_save_refuses_what_is_not_an_hf_model(tmp_path):
    with pytest.raises(TypeError, match="hf.save takes an HFModel"):
        hf.save({"params": {}}, tmp_path)
