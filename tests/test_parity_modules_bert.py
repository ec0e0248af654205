"""The parity report across the pair transformers' PyTorch BERT / this project's Flax BERT
(`flax_transformer.hf.load`), with the BERT family's module-name mapping (parity.hf_bert):
all green in float64 over the real tokens of a padded batch with token types, then one bug on
the Flax side at a time (noise in one feed-forward kernel, a wrong LayerNorm eps), each named
at the right transformers module with the weight verdict.

The bugs change the Flax variables or config, never the library code. The model is a tiny
random BertForSequenceClassification built by tests/hf_models.py and saved with
save_pretrained (nothing is downloaded)."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from flax_transformer.parity import EXCLUDE, ParityInputError
from flax_transformer.parity.diagnosis import HYPERPARAMETER_DIFFERS, WEIGHTS_DIFFER
from flax_transformer.parity.hf_bert import (
    bert_module_names,
    compare_hf_encoder,
    encoder_module_names,
)

from . import hf_models

pytest.importorskip("transformers")

# Each BERT layer's torch modules whose value the Flax side has no module of its own for: the
# attention context before its output dense, and modules repeating their last child's output.
EXCLUDED_PER_LAYER = (
    "attention.self:0",
    "attention.output",
    "attention:0",
    "intermediate",
    "output",
)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    from flax_transformer import hf

    torch_model = hf_models.build_encoder_only("bert_sequence")
    path = hf_models.save(torch_model, tmp_path_factory.mktemp("bert") / "bert")
    model = hf.load(path)
    ids, mask, token_types = hf_models.encoder_only_batch(np.random.default_rng(0), pad=0)
    assert (mask == 0).any() and (token_types[mask == 1] > 0).any()  # padded, with types
    return torch_model, model, ids, mask, token_types


def run(bert, model=None):
    torch_model, loaded, ids, mask, token_types = bert
    return compare_hf_encoder(torch_model, model or loaded, ids, mask, token_types)


def test_bert_is_green(bert):
    report = run(bert)
    assert report.ok, report.format_table()
    assert report.dtype == "float64" and report.masked_excluded
    compared = [t for t in report.tensors if t.status == "ok"]
    # 5 embedding values and their sum, 12 per layer (q, k, v, attention dense, dropout, norm,
    # intermediate dense, activation, output dense, dropout, norm, the layer), the encoder, the
    # pooler's dense and tanh, the classifier's dropout and dense, the logits
    assert len(compared) == 6 + 2 * 12 + 1 + 2 + 2 + 1 == 36
    assert max(t.rel for t in compared) < 1e-12
    assert report.info["paired"] == {"mapping": 34, "canonical": 1, "auto": 1}
    assert report.info["mapping_problems"] == []
    missing = [t.name for t in report.tensors if t.status == "missing"]
    assert missing == [
        *(f"bert.encoder.layer.{i}.{part}" for i in range(2) for part in EXCLUDED_PER_LAYER),
        "bert.pooler",  # = its activation
        "bert:last_hidden_state",  # the encoder's and the pooler's values again
        "bert:pooler_output",
    ]
    by_name = {t.name: t for t in report.tensors}
    assert by_name["bert.encoder.layer.1.output.dense"].flax_name == "encoder/layers_1/ffn/linear2"
    assert by_name["bert.embeddings.position_embeddings"].shape == (12, 32)  # the rows read
    assert by_name["bert.embeddings"].flax_name == "(root):src_embedded"  # the fallback's pair
    assert by_name["(root):logits"].shape == (3, 3)


def test_noise_in_one_ffn_kernel_is_named_at_its_module(bert):
    model = bert[1]
    params = jax.tree.map(np.array, model.variables)
    kernel = params["params"]["encoder"]["layers_1"]["ffn"]["linear2"]["kernel"]
    kernel += np.random.default_rng(1).normal(0.0, 1e-3, kernel.shape).astype(kernel.dtype)
    report = run(bert, dataclasses.replace(model, variables=params))
    assert report.first_divergence == "bert.encoder.layer.1.output.dense"
    assert report.diagnosis.verdict == WEIGHTS_DIFFER
    weights = {(w.torch_name, w.flax_name): w.status for w in report.diagnosis.weights}
    assert weights == {("weight", "kernel"): "differs", ("bias", "bias"): "equal"}
    # everything before it agrees: the embeddings, layer 0, layer 1 up to its second dense
    before = report.tensors[: [t.name for t in report.tensors].index(report.first_divergence)]
    assert all(t.ok for t in before) and sum(t.status == "ok" for t in before) == 6 + 12 + 8
    assert report.diagnosis.unverified == ("bert.encoder.layer.1.intermediate",)


def test_wrong_layer_norm_eps_is_a_hyperparameter_difference(bert):
    model = bert[1]
    config = dataclasses.replace(model.config, layer_norm_eps=1e-5)  # BERT's is 1e-12
    wrong = dataclasses.replace(model, module=type(model.module)(config), config=config)
    report = run(bert, wrong)
    assert report.first_divergence == "bert.embeddings.LayerNorm"
    assert report.diagnosis.verdict == HYPERPARAMETER_DIFFERS
    assert report.diagnosis.detail == (
        "bert.embeddings.LayerNorm.eps = 1e-12 vs src_embed_norm/epsilon = 1e-05"
    )


def test_the_mapping_by_name():
    assert bert_module_names("bert.encoder.layer.3.attention.self.query") == (
        "encoder/layers_3/self_attn/query"
    )
    assert bert_module_names("encoder.layer.0.output.LayerNorm") == "encoder/layers_0/norm2"
    assert bert_module_names("cls.predictions.transform.dense") == "head/dense"
    assert bert_module_names("classifier") == "head/classifier"
    assert bert_module_names("bert.encoder.layer.0.attention.self") is EXCLUDE
    assert bert_module_names("bert.embeddings") is None  # left to the fallback
    roberta = encoder_module_names("roberta", "sequence_tanh")
    assert roberta("classifier") == "head" and roberta("classifier.out_proj") == "head/classifier"
    distil = encoder_module_names("distilbert", "sequence_relu")
    assert distil("distilbert.transformer.layer.1.attention.q_lin") == (
        "encoder/layers_1/self_attn/query"
    )


def test_bad_inputs_are_named():
    with pytest.raises(ParityInputError, match="not of the BERT family"):
        encoder_module_names("gpt2")
    with pytest.raises(ParityInputError, match="head 'lm' is not one of"):
        encoder_module_names("bert", "lm")
    torch_model = types.SimpleNamespace(config=types.SimpleNamespace(model_type="roberta"))
    flax_model = types.SimpleNamespace(hf_config={"model_type": "bert"})
    with pytest.raises(ParityInputError, match="a 'roberta' model, the Flax one 'bert'"):
        compare_hf_encoder(torch_model, flax_model, np.zeros((1, 3), np.int32))


# The rest of the family, green the same way (slow: one model each).
OTHERS = [name for name in hf_models.ENCODER_MODELS if name != "bert_sequence"]


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHERS)
def test_the_family_is_green(name, tmp_path):
    from flax_transformer import hf

    torch_model = hf_models.build_encoder_only(name)
    model = hf.load(hf_models.save(torch_model, tmp_path / name))
    has_types = torch_model.config.model_type != "distilbert"
    pad = torch_model.config.pad_token_id
    ids, mask, token_types = hf_models.encoder_only_batch(np.random.default_rng(0), pad, has_types)
    report = compare_hf_encoder(torch_model, model, ids, mask, token_types)
    assert report.ok, report.format_table()
    compared = [t for t in report.tensors if t.status == "ok"]
    assert len(compared) >= 31 and max(t.rel for t in compared) < 1e-12
    assert report.info["paired"]["auto"] <= 1 and report.info["mapping_problems"] == []
