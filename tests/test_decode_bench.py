"""The decoding benchmark's smoke run: the JSON it writes has what the README table needs."""

import json

import pytest

from bench.decode import main


@pytest.mark.slow  # 10 s: a benchmark smoke run
def test_quick_benchmark_writes_results(tmp_path, capsys):
    out, png = tmp_path / "decode.json", tmp_path / "latency.png"
    assert main(["--quick", "--json", str(out), "--plot", str(png)]) == 0
    result = json.loads(out.read_text())
    assert result["lengths"] == [4, 8]
    for key in ("cached_tok_s", "uncached_tok_s", "cached_ms_per_token", "speedup"):
        assert len(result[key]) == 2 and all(v > 0 for v in result[key])
    assert result["same_tokens"] is True  # both paths decode the same tokens
    assert png.stat().st_size > 1000
    assert "| 8 |" in capsys.readouterr().out
