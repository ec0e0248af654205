"""The README's Python blocks run as written.

Every ```python block of README.md is executed by one test below, found by a line it contains.
Blocks that continue a previous one (the tour: model -> conversion -> generate -> parity) share
one namespace; a block that needs files or names the README leaves to the reader (an exported
directory, `weights.safetensors`, `torch_block` and `FlaxBlock`, a `save_pretrained` directory)
gets them from the test, built from the tiny preset, in a temporary working directory. A new
block with no test here fails `test_every_block_is_run`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

# A line of each block -> the test that runs it.
OWNERS = {
    'config = preset("tiny")': "test_the_tour",
    "torch_model = torch_reference.Transformer(config)": "test_the_tour",
    "from flax_transformer.decoding import Beam, Greedy, Sample, generate": "test_generating",
    "report = compare_weights(config, params, state)": "test_the_tour",
    "def test_my_port_matches_torch():": "test_parity_for_your_own_port",
    'greedy = jax.export.deserialize(open("exported/greedy.stablehlo", "rb").read())': (
        "test_serving_an_exported_run"
    ),
    'params, config, kind = load_flax_params("weights.safetensors")': "test_nnx",
    'hf.save(model, "out")': "test_hugging_face",
    'model = hf.load("./Qwen2.5-0.5B-Instruct")': "test_decoder_llm",
}


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def block(marker: str) -> str:
    (found,) = [b for b in python_blocks() if marker in b]
    return found


def run_block(marker: str, namespace: dict) -> dict:
    code = compile(block(marker), f"README.md block: {marker}", "exec")
    exec(code, namespace)  # noqa: S102 - the README's own code
    return namespace


def test_every_block_is_run():
    for code in python_blocks():
        owners = {test for marker, test in OWNERS.items() if marker in code}
        assert len(owners) == 1, (
            f"README block with no (or two) tests in tests/test_readme.py:\n{code}"
        )


TOUR = [m for m, test in OWNERS.items() if test == "test_the_tour"]


@pytest.fixture(scope="module")
def tour() -> dict:
    """The tour's namespace: a model, its conversion to torch and back, parity (the generate
    block, which continues the same namespace, is test_generating's: three searches compiled)."""
    namespace: dict = {}
    for marker in TOUR:
        run_block(marker, namespace)
    return namespace


def test_the_tour(tour):
    assert tour["logits"].shape == (2, 3, 44)
    assert tour["report"].ok and tour["report"].first_divergence is None


@pytest.mark.slow  # greedy, beam and sampling loops compiled
def test_generating(tour):
    namespace = run_block("from flax_transformer.decoding import Beam, Greedy, Sample", dict(tour))
    assert namespace["tokens"].shape == (2, 4, 8) and namespace["scores"].shape == (2, 4)
    assert namespace["sampled"].shape == (2, 8)


class _Blocks:
    """`torch_block` and `FlaxBlock` for the own-port block: fc1 -> ReLU -> fc2 around a q_proj
    whose (B, L, 8) output the port keeps as (B, L, 2, 4) heads."""

    @staticmethod
    def build():
        import torch
        from flax import linen as nn

        class TorchBlock(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.q_proj = torch.nn.Linear(8, 8)
                self.fc1 = torch.nn.Linear(8, 12)
                self.fc2 = torch.nn.Linear(12, 8)

            def forward(self, x):
                x = x + self.q_proj(x)
                return self.fc2(torch.relu(self.fc1(x)))

        class FlaxBlock(nn.Module):
            @nn.compact
            def __call__(self, x):
                q = nn.DenseGeneral((2, 4))(x)  # (B, L, heads, head_dim)
                x = x + q.reshape(x.shape)
                hidden = nn.relu(nn.Dense(12)(x))  # Dense_0 (fc1): linen names by creation
                return nn.Dense(8)(hidden)  # Dense_1 (fc2)

        torch.manual_seed(0)
        torch_block = TorchBlock().double()
        w = {k: v.detach().numpy() for k, v in torch_block.state_dict().items()}
        dense = lambda n: {"kernel": w[f"{n}.weight"].T, "bias": w[f"{n}.bias"]}  # noqa: E731
        variables = {
            "params": {
                "DenseGeneral_0": {
                    "kernel": w["q_proj.weight"].T.reshape(8, 2, 4),
                    "bias": w["q_proj.bias"].reshape(2, 4),
                },
                "Dense_0": dense("fc1"),
                "Dense_1": dense("fc2"),
            }
        }
        return torch_block, FlaxBlock, variables


def test_parity_for_your_own_port(capsys):
    """The block's test passes on a faithful port, and its report prints when they agree (the
    snippet used to read `report.diagnosis.verdict`, None then)."""
    torch_block, flax_block, variables = _Blocks.build()
    namespace = {"np": np, "torch_block": torch_block, "FlaxBlock": flax_block}
    namespace["variables"] = variables
    run_block("def test_my_port_matches_torch():", namespace)
    namespace["test_my_port_matches_torch"]()
    assert namespace["report"].ok
    assert capsys.readouterr().out.startswith("OK: all ")


@pytest.mark.slow  # the NNX train step compiled
def test_nnx(tour, tmp_path, monkeypatch):
    import optax

    from flax_transformer.interop.convert import save_flax_params

    monkeypatch.chdir(tmp_path)
    save_flax_params("weights.safetensors", tour["variables"], tour["config"])
    src, tgt = tour["src"], tour["tgt"]
    batch = {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}
    namespace = {"src": src, "tgt_in": batch["tgt_in"], "tx": optax.adamw(1e-3), "batch": batch}
    run_block('params, config, kind = load_flax_params("weights.safetensors")', namespace)
    assert namespace["logits"].shape == (2, 2, 44)
    assert set(namespace["params"]) == set(tour["variables"]["params"])  # the linen tree


@pytest.mark.slow  # a run exported to StableHLO (the greedy loop lowered and serialized)
def test_serving_an_exported_run(tmp_path, monkeypatch, capsys):
    """The serving block against an export of a fabricated run whose greedy choice is EOS at
    once (nothing is trained here): it runs as written and prints one line per text."""
    from flax_transformer.cli.main import main as ftx

    from .export_runs import CONFIG, fabricate_run, random_params

    params = random_params(CONFIG, "seq2seq")
    params["lm_head"]["bias"][2] = 100.0  # eos_id of the byte tokenizer
    run = fabricate_run(tmp_path / "run", "seq2seq", checkpoint=False)
    _replace_checkpoint(run, params)
    monkeypatch.chdir(tmp_path)
    assert ftx(["export", "--workdir", str(run), "--format", "stablehlo", "--out", "exported"]) == 0
    capsys.readouterr()
    run_block('greedy = jax.export.deserialize(open("exported/greedy.stablehlo", "rb").read())', {})
    assert capsys.readouterr().out == "\n\n"  # EOS first: two empty texts


def _replace_checkpoint(run: Path, params) -> None:
    """The run's checkpoint with `params` (export_runs.fabricate_run, checkpoint=False, then
    this)."""
    import optax

    from flax_transformer.nn.kinds import model_for
    from flax_transformer.training.checkpoint import Checkpointer
    from flax_transformer.training.state import create_train_state

    from .export_runs import CONFIG

    state = create_train_state(model_for(CONFIG, "seq2seq"), optax.sgd(0.1), seed=0, params=params)
    checkpointer = Checkpointer(run / "checkpoints")
    checkpointer.save(state)
    checkpointer.close()


@pytest.mark.slow  # transformers builds and saves a Marian model; beam search compiles
def test_hugging_face(tmp_path, monkeypatch):
    from . import hf_models

    monkeypatch.chdir(tmp_path)
    hf_models.save(hf_models.build("marian", seed=2), tmp_path / "opus-mt-en-de", tokenizer=True)
    namespace = run_block('hf.save(model, "out")', {})
    assert namespace["tokens"].shape[0] == 1
    from transformers import AutoModelForSeq2SeqLM

    AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")


@pytest.mark.slow  # transformers builds a Llama; greedy generation compiles (about 25 s)
def test_decoder_llm(tmp_path, monkeypatch):
    from . import hf_llms

    monkeypatch.chdir(tmp_path)
    hf_llms.build("qwen2_biases_yarn_window_tied").save_pretrained(
        tmp_path / "Qwen2.5-0.5B-Instruct"
    )
    namespace = run_block('model = hf.load("./Qwen2.5-0.5B-Instruct")', {})
    assert namespace["tokens"].shape[0] == 2
    np.testing.assert_array_equal(namespace["tokens"][:, :5], namespace["ids"])
