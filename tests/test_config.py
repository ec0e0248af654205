import pytest

from flax_transformer import TransformerConfig


def test_json_round_trip(tmp_path):
    cfg = TransformerConfig(d_model=64, num_heads=4, activation="gelu", norm_first=True)
    assert TransformerConfig.from_json(cfg.to_json()) == cfg
    cfg.save(tmp_path / "c.json")
    assert TransformerConfig.load(tmp_path / "c.json") == cfg


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        TransformerConfig().d_model = 3


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=30, num_heads=4), r"d_model \(30\) must be divisible by num_heads \(4\)"),
        (dict(d_ff=0), "d_ff must be a positive int"),
        (dict(activation="swish"), "activation must be one of"),
        (dict(positional="alibi"), "positional must be one of"),
        (dict(dropout_rate=1.5), r"dropout_rate must be a finite number in \[0, 1\)"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps must be a finite number > 0"),
        (dict(share_embeddings=True, src_vocab_size=10), "share_embeddings needs"),
        (dict(pad_id=300), "pad_id must be a token id"),
        (dict(dtype="int8"), "dtype must be one of"),
        (dict(sinusoid_layout="sin_cos"), "sinusoid_layout must be one of"),
        (dict(position_offset=-2), "position_offset must be a non-negative int"),
        (dict(embed_norm=1), "embed_norm must be true or false"),
        (dict(eos_id=256), "eos_id must be a token id inside the target vocabulary"),
        (dict(decoder_start_id=-1), "decoder_start_id must be a non-negative int"),
    ],
)
def test_invalid_configs_name_the_problem(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**changes)


def test_several_problems_are_reported_together():
    with pytest.raises(ValueError) as err:
        TransformerConfig(d_ff=-1, activation="tanh")
    assert "d_ff" in str(err.value) and "activation" in str(err.value)


def test_bad_json_files(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: config is not valid JSON"):
        TransformerConfig.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="unknown TransformerConfig field"):
        TransformerConfig.from_dict({"d_modl": 3})
