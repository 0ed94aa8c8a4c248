"""`python -m vllm_x86.quant.quality`: the raw numbers survive a run that stops."""

from __future__ import annotations

import json

import pytest

from vllm_x86.quant import quality


def test_json_is_written_after_every_variant(tmp_path, monkeypatch):
    done = []

    def fake_variant(model, name, window, prompts):
        if name == "x86_int4":
            raise RuntimeError("x86_int4 failed")
        done.append(name)
        return {"ppl": 10.0 + len(done), "scored_tokens": 5, "windows": 1, "greedy": [[1, 2]]}

    monkeypatch.setattr(quality, "run_variant", fake_variant)
    out = tmp_path / "q.json"
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(RuntimeError, match="x86_int4 failed"):
        quality.main(
            ["--model", str(model), "--variants", "bf16,x86_int8,x86_int4", "--json", str(out)]
        )
    saved = json.loads(out.read_text())
    assert list(saved) == ["bf16", "x86_int8"]
    assert saved["x86_int8"]["ppl"] == 12.0
