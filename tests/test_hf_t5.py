"""The T5 family (T5 v1.0, v1.1 / Flan-T5, mT5, UMT5, and the three bare encoders) against
transformers: tiny models transformers builds and trains briefly here (tests/hf_models.py),
saved with save_pretrained.

float64 is compared with transformers' models with their layer norms computing the variance in
float64 (transformers takes it in float32 even in a float64 model: ~3e-7 relative noise), within
1e-12 of the largest value; float32 with transformers as it is, within 1e-5. Inputs are padded
batches of up to 20 tokens: past the exact buckets and past the largest distance (10)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from flax_transformer import hf
from flax_transformer.hf.length_buckets import bucket_length, pad_columns
from flax_transformer.hf.xla_cpu import encoder_compiler_options
from flax_transformer.spec.numerics import assert_close

from . import hf_models
from .hf_models import T5_EOS, T5_MODELS, T5_PAD, t5_batch, t5_norms_in_input_dtype

SEQ2SEQ = ("t5", "t5_v1_1", "mt5", "umt5")
ENCODERS = ("t5_encoder", "mt5_encoder", "umt5_encoder")
LENGTHS = (20, 7, 13)  # a padded batch whose longest row reaches every bucket
NEW = 12
# The models the fast suite builds (a few seconds each): the others' tests are marked slow.
FAST = ("t5_v1_1", "umt5_encoder")


class Models(dict):
    """{name: (trained transformers model, its save_pretrained directory)}, built on first
    use (once per module)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name):
        torch_model = hf_models.build_t5(name)
        path = self.tmp_path_factory.mktemp(name)
        torch_model.save_pretrained(path)
        self[name] = (torch_model, path)
        return self[name]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return Models(tmp_path_factory)


def inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    ids, mask = t5_batch(rng, LENGTHS)
    decoder = rng.integers(3, hf_models.T5_VOCAB, size=(len(LENGTHS), 9))
    decoder[:, 0] = T5_PAD  # the decoder start
    return ids, mask, decoder


@pytest.mark.parametrize(
    "name",
    [
        *[n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in SEQ2SEQ],
        *[n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in ENCODERS],
    ],
)
def test_float64_outputs_equal_the_float64_formula(models, name):
    torch_model, path = models[name]
    with jax.enable_x64(True):
        ours, theirs = hf_models.t5_outputs_pair(name, torch_model, path, "float64")
    assert hf.load(path).kind == ("encoder" if name in ENCODERS else "seq2seq")
    batch, length = len(LENGTHS), max(LENGTHS)
    if name in ENCODERS:
        assert ours.shape == theirs.shape == (batch, length, 16)
    else:
        assert ours.shape == theirs.shape == (batch, 9, hf_models.T5_VOCAB)
    assert_close(ours, theirs, rtol=1e-12, what=f"{name} float64")


@pytest.mark.parametrize("name", ["t5_v1_1", "umt5_encoder"])
def test_float32_outputs_equal_transformers_as_it_is(models, name):
    torch_model, path = models[name]
    ours, theirs = hf_models.t5_outputs_pair(name, torch_model, path, "float32")
    assert_close(ours, theirs, rtol=1e-5, what=f"{name} float32")


@pytest.mark.slow
def test_the_config_is_read_as_transformers_5_reads_it(models):
    """v1.0: head tied, output scaled; v1.1 and mT5 (a head of their own): untied, unscaled;
    UMT5: one relative bias per layer; every head and stack dimension as configured."""
    expected = {
        "t5": (True, True, False, False),
        "t5_v1_1": (False, False, False, True),
        "mt5": (False, False, False, True),
        "umt5": (True, True, True, True),
    }
    for name, (tied, scaled, per_layer, gated) in expected.items():
        config = hf.load(models[name][1]).config
        got = (
            config.tie_output,
            config.scale_decoder_output,
            config.relative_attention_per_layer,
            config.gated_ffn,
        )
        assert got == (tied, scaled, per_layer, gated), name
        assert (config.head_dim, config.attention_dim, config.d_model) == (6, 18, 16)
        assert (config.norm_type, config.positional, config.use_bias) == ("rms", "none", False)
    assert hf.load(models["t5"][1]).config.num_decoder_layers == 3


def test_a_transformers_4_config_loads_the_same(models, tmp_path):
    """Hub files written by transformers 4 say tie_word_embeddings false and no
    scale_decoder_outputs for v1.1: the same model."""
    torch_model, path = models["t5_v1_1"]
    hf_models_copy = tmp_path / "v4"
    hf_models_copy.mkdir()
    for file in path.iterdir():
        (hf_models_copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((path / "config.json").read_text())
    config["tie_word_embeddings"] = False
    config.pop("scale_decoder_outputs", None)
    (hf_models_copy / "config.json").write_text(json.dumps(config))
    assert hf.load(hf_models_copy).config == hf.load(path).config


def _generate_both(torch_model, flax_model, ids, mask, **kwargs):
    # transformers 5 sizes its decoder cache by num_layers, not num_decoder_layers (an
    # IndexError for v1.0's 3 decoder layers over 2): it recomputes instead.
    uncached = torch_model.config.num_decoder_layers != torch_model.config.num_layers
    with torch.no_grad():
        theirs = torch_model.generate(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            use_cache=not uncached,
            **kwargs,
        ).numpy()
    ours = flax_model.generate(ids, mask, **kwargs)
    return ours, theirs


GREEDY = {}
BEAMS = {
    f"beam4_lp{lp}": dict(num_beams=4, length_penalty=lp, early_stopping=True) for lp in (1.0, 0.6)
}
SEARCHES = {"greedy": GREEDY, **BEAMS}
# The fast suite: v1.1, greedy and one beam setting; the rest is slow.
FAST_SEARCHES = {("t5_v1_1", "greedy"), ("t5_v1_1", "beam4_lp0.6")}


@pytest.mark.parametrize(
    "name, search",
    [
        (n, s) if (n, s) in FAST_SEARCHES else pytest.param(n, s, marks=pytest.mark.slow)
        for n in SEQ2SEQ
        for s in SEARCHES
    ],
)
def test_greedy_and_beam_token_identical(models, name, search):
    """Greedy, and beam 4 with length penalty 1.0 and 0.6 and early stopping, max_new_tokens;
    float64 both sides (the same formula). The trained models reverse their input and stop:
    rows end at different steps."""
    torch_model, path = models[name]
    ids, mask, _ = inputs(seed=1)
    ids, mask = ids[:, :14], mask[:, :14]
    options = SEARCHES[search]
    with jax.enable_x64(True), t5_norms_in_input_dtype():
        flax_model = hf.load(path, dtype="float64")
        ours, theirs = _generate_both(
            torch_model.double(), flax_model, ids, mask, max_new_tokens=NEW, **options
        )
    assert ours.shape == theirs.shape, (ours.tolist(), theirs.tolist())
    np.testing.assert_array_equal(ours, theirs)
    assert (ours[:, 0] == T5_PAD).all()  # decoding starts with the pad id
    ended = (ours[:, 1:] == T5_EOS).any(1)
    assert ended.any(), ours.tolist()  # not degenerate: the trained model stops


@pytest.mark.parametrize(
    "name",
    [
        "t5_v1_1",
        "umt5_encoder",
        *[pytest.param(n, marks=pytest.mark.slow) for n in ("t5", "umt5", "mt5_encoder")],
    ],
)
def test_save_round_trip_is_bit_exact_and_transformers_loads_it(models, name, tmp_path):
    torch_model, path = models[name]
    model = hf.load(path)
    hf.save(model, tmp_path)
    before = load_file(str(path / "model.safetensors"))
    after = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        assert after[key].dtype == value.dtype, key
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    import transformers

    cls = getattr(transformers, T5_MODELS[name][0])
    reloaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    for key, value in reloaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), torch_model.state_dict()[key].numpy(), key)
    if name not in ENCODERS:  # the head and scaling as before: the same logits
        assert reloaded.config.scale_decoder_outputs == torch_model.config.scale_decoder_outputs
        tied = reloaded.lm_head.weight.data_ptr() == reloaded.shared.weight.data_ptr()
        assert tied == model.config.tie_output


def test_encoder_fn_is_jittable_and_runs_in_bfloat16(models):
    torch_model, path = models["umt5_encoder"]
    model = hf.load(path)
    ids, mask, _ = inputs()
    encode = model.encoder_fn()
    hidden = jax.jit(encode)(ids, mask)
    # forward pads to the length bucket (hf.length_buckets) and compiles a float32 encoder
    # with hf.xla_cpu's options: bit for bit encoder_fn jitted with the same options (the
    # recipe docs/hf.md gives), and a plain jit at the batch's own length the same up to
    # float32 rounding (the real tokens)
    out = model.forward(ids, mask)
    bucket = bucket_length(ids.shape[1], model.config.max_len)
    padded = pad_columns(ids, bucket, model.config.pad_id), pad_columns(mask, bucket, 0)
    own_jit = jax.jit(encode, compiler_options=encoder_compiler_options(float32=True))
    np.testing.assert_array_equal(np.asarray(own_jit(*padded))[:, : ids.shape[1]], out)
    real = mask == 1
    assert_close(out[real], np.asarray(hidden)[real], rtol=1e-5, what="forward")
    # Inside a model of one's own: params passed in, gradients through the encoder.
    loss = lambda params: encode(ids, mask, params=params).mean()  # noqa: E731
    grads = jax.jit(jax.grad(loss))(model.variables)
    assert jax.tree.structure(grads) == jax.tree.structure(model.variables)
    bf16 = jax.jit(model.encoder_fn(dtype="bfloat16"))(ids, mask)
    assert bf16.dtype == jax.numpy.bfloat16
    assert_close(np.asarray(bf16, np.float32), np.asarray(hidden), rtol=3e-2, what="bf16")
    seq2seq = hf.load(models["t5_v1_1"][1])
    encoded = jax.jit(seq2seq.encoder_fn())(ids, mask)
    assert encoded.shape == (len(LENGTHS), ids.shape[1], 16)
    with pytest.raises(ValueError, match="no decoder to generate with"):
        model.generate(ids, mask)
    with pytest.raises(ValueError, match="input_ids and attention_mask only"):
        model.forward(ids, mask, decoder_input_ids=ids)


def test_import_export_round_trip_of_a_t5_and_an_encoder(models, tmp_path):
    from flax_transformer.cli import generate as generate_cli
    from flax_transformer.cli.hf import main as hf_main
    from flax_transformer.runs.run_dir import read_run_json

    for name in ("t5_v1_1", "umt5_encoder"):
        _, path = models[name]
        source = tmp_path / f"{name}_hf"
        source.mkdir()
        for file in path.iterdir():
            (source / file.name).write_bytes(file.read_bytes())
        hf_models.t5_tokenizer().save_pretrained(source)
        run = tmp_path / f"{name}_run"
        assert hf_main(["import", str(source), str(run)]) == 0
        assert read_run_json(run)["model"] == ("encoder" if "encoder" in name else "seq2seq")
        if "encoder" in name:  # a bare encoder generates nothing: a clear refusal
            (tmp_path / "in.txt").write_text("a b c\n")
            argv = ["--workdir", str(run), "--input", str(tmp_path / "in.txt")]
            assert generate_cli.main(argv) == 2
        assert hf_main(["export", str(run), str(tmp_path / f"{name}_out")]) == 0
        before = load_file(str(path / "model.safetensors"))
        after = load_file(str(tmp_path / f"{name}_out" / "model.safetensors"))
        assert sorted(after) == sorted(before)
        for key, value in before.items():
            np.testing.assert_array_equal(after[key], value, err_msg=f"{name} {key}")


def test_bad_t5_configs_name_the_option():
    from flax_transformer.hf.config import UnsupportedConfigError, hf_to_config

    base = dict(model_type="t5", architectures=["T5ForConditionalGeneration"])
    with pytest.raises(UnsupportedConfigError, match="feed_forward_proj='gated-gelu-x'"):
        hf_to_config({**base, "feed_forward_proj": "gated-gelu-x"})
    with pytest.raises(UnsupportedConfigError, match="dense_act_fn='tanh'"):
        hf_to_config({**base, "feed_forward_proj": "tanh"})
    with pytest.raises(UnsupportedConfigError, match="relative_attention_num_buckets"):
        hf_to_config({**base, "relative_attention_num_buckets": "32"})
    with pytest.raises(UnsupportedConfigError, match="T5Model"):
        hf_to_config({**base, "architectures": ["T5Model"]})
    config, _ = hf_to_config({**base, "architectures": ["T5EncoderModel"]})
    assert config.num_decoder_layers == 0 and config.max_len == 512


@pytest.mark.slow
def test_fine_tune_with_init_from_then_export_to_transformers(models, tmp_path):
    """A v1.1 import -> train.py --init-from, 10 steps on a tiny TSV (packed rows: the relative
    bias from per-token positions) -> export -> transformers loads it strictly and gives the
    fine-tuned Flax model's logits (float32, 1e-5)."""
    import random

    from transformers import T5ForConditionalGeneration

    from flax_transformer.cli import train
    from flax_transformer.cli.hf import main as hf_main
    from flax_transformer.runs.load import load_run

    _, path = models["t5_v1_1"]
    source = tmp_path / "hf"
    source.mkdir()
    for file in path.iterdir():
        (source / file.name).write_bytes(file.read_bytes())
    hf_models.t5_tokenizer().save_pretrained(source)
    run_dir = tmp_path / "run"
    assert hf_main(["import", str(source), str(run_dir)]) == 0
    rng = random.Random(0)
    lines = []
    for _ in range(40):
        words = rng.choices(hf_models.WORDS[:20], k=rng.randint(2, 5))
        lines.append(" ".join(words) + "\t" + " ".join(reversed(words)))
    (tmp_path / "train.tsv").write_text("\n".join(lines[:36]) + "\n")
    (tmp_path / "valid.tsv").write_text("\n".join(lines[36:]) + "\n")
    workdir = tmp_path / "tuned"
    argv = ["--init-from", run_dir, "--train-tsv", tmp_path / "train.tsv", "--valid-tsv",
            tmp_path / "valid.tsv", "--workdir", workdir, "--steps", 10, "--batch-size", 8,
            "--warmup", 2, "--lr", 3e-3, "--eval-every", 10, "--save-every", 10]  # fmt: skip
    assert train.main([str(a) for a in argv]) == 0
    tuned = load_run(workdir)
    moved = [
        float(np.abs(a - b).max())
        for a, b in zip(
            jax.tree.leaves(tuned.params), jax.tree.leaves(load_run(run_dir).params), strict=True
        )
    ]
    assert max(moved) > 1e-3  # it trained
    out = tmp_path / "out"
    assert hf_main(["export", str(workdir), str(out)]) == 0
    reloaded, info = T5ForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    ours, theirs = hf_models.t5_outputs_pair("t5_v1_1", reloaded.eval(), out, "float32")
    assert_close(ours, theirs, rtol=1e-5, what="fine-tuned T5 v1.1 logits")
