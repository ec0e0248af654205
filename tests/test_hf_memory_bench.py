"""bench.hf_memory: its synthetic checkpoint is one transformers and hf.load read, sharded as
save_pretrained shards; the whole run (subprocesses, table, JSON). Both in the slow pass."""

from __future__ import annotations

import json

import jax
import ml_dtypes
import numpy as np
import pytest

from bench import hf_memory
from flax_transformer import hf


@pytest.mark.slow  # transformers' from_pretrained and hf.load of a 3 MB model (about 10 s)
def test_the_synthetic_checkpoint_is_a_sharded_bfloat16_save(tmp_path):
    from transformers import AutoModelForCausalLM

    config = hf_memory.hf_config("gpt2", tiny=True)
    nbytes = hf_memory.write_checkpoint(tmp_path, config, "1MB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    count = len(shards)
    assert count > 1  # the 3.2 MB embedding alone in one
    assert shards == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    assert index["metadata"]["total_size"] == nbytes
    model = hf.load(tmp_path, dtype="bfloat16")
    leaves = [np.asarray(x) for x in jax.tree.leaves(model.variables)]
    assert all(x.dtype == ml_dtypes.bfloat16 for x in leaves)
    assert sum(x.nbytes for x in leaves) == nbytes  # the tied head is stored once
    theirs, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert model.tokenizer is not None


@pytest.mark.slow  # three subprocesses importing JAX (about a minute)
def test_the_run_measures_import_and_export(tmp_path, capsys):
    out = tmp_path / "result.json"
    argv = ["--family", "gpt2", "--layers", "1", "--gb", "0", "--max-shard-size", "100MB"]
    hf_memory.main([*argv, "--dir", str(tmp_path / "work"), "--json", str(out)])
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {
        "baseline (tiny import)", "import", "baseline (tiny export)", "export"
    }  # fmt: skip
    assert len(result["export_files"]) >= 2  # the 160 MB embedding alone in one
    assert all(row["peak_rss_mb"] > 0 for row in result["rows"].values())
    assert not (tmp_path / "work").exists()  # the GBs are deleted
    assert "| import |" in capsys.readouterr().out
