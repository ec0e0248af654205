"""bench.growing_cache: both sides decode the same tokens, and the report names the lengths."""

from __future__ import annotations

import json

import pytest

from bench import growing_cache
from flax_transformer.decoding import cache


@pytest.mark.slow  # a benchmark smoke run, 4 compilations
def test_run_writes_the_report_and_restores_the_first_length(tmp_path, capsys):
    out = tmp_path / "growing.json"
    argv = ["--quick", "--rounds", "1", "--new-tokens", "40", "--json", str(out)]
    assert growing_cache.main(argv) == 0
    result = json.loads(out.read_text())
    assert [(c["new_tokens"], c["beams"], c["lengths"]) for c in result["cells"]] == [
        (40, 1, [32, 40]), (40, 4, [32, 40]),
    ]  # fmt: skip
    assert all(c["growing_s"] > 0 and c["one_length_s"] > 0 for c in result["cells"])
    assert "| 40 | 4 | 32, 40 |" in capsys.readouterr().out
    assert cache.FIRST_CACHE_LEN == 32
