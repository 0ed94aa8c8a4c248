"""`python -m vllm_x86.tools.quantize.quality`: the raw numbers survive a run that stops,
in the run's folder; the summary (no token ids) goes where --json says."""

from __future__ import annotations

import json

import pytest

from vllm_x86.tools.quantize import quality


def test_results_and_summary_are_written_after_every_variant(tmp_path, monkeypatch):
    done = []

    def fake_variant(model, name, window, prompts):
        if name == "x86_int4":
            raise RuntimeError("x86_int4 failed")
        done.append(name)
        greedy = [[1, 2, 3, 4], [5, 6, 7, 8]] if name == "bf16" else [[1, 2, 0, 0], [5, 6, 7, 8]]
        return {"ppl": 10.0 + len(done), "scored_tokens": 5, "windows": 1, "greedy": greedy}

    monkeypatch.setattr(quality, "run_variant", fake_variant)
    out = tmp_path / "docs" / "q.json"
    model = tmp_path / "model"
    model.mkdir()
    argv = ["--model", str(model), "--variants", "bf16,x86_int8,x86_int4", "--json", str(out),
            "--out", str(tmp_path / "runs")]  # fmt: skip
    with pytest.raises(RuntimeError, match="x86_int4 failed"):
        quality.main(argv)
    (run_dir,) = (tmp_path / "runs").iterdir()
    raw = json.loads((run_dir / "results.json").read_text())
    assert raw["kind"] == quality.RAW_KIND and raw["window"] == 1024 and raw["prompts"] == 100
    assert list(raw["variants"]) == ["bf16", "x86_int8"]
    assert raw["variants"]["x86_int8"]["greedy"] == [[1, 2, 0, 0], [5, 6, 7, 8]]
    saved = json.loads(out.read_text())
    assert saved == json.loads((run_dir / "summary.json").read_text())
    assert saved["raw"] == str(run_dir / "results.json")
    assert list(saved["variants"]) == ["bf16", "x86_int8"]
    row = saved["variants"]["x86_int8"]
    assert "greedy" not in row and row["ppl"] == 12.0
    assert row["ppl_vs_baseline_pct"] == pytest.approx(100 * (12.0 / 11.0 - 1))
    # one prompt of two identical; 2 of 4 and 4 of 4 tokens before the first difference
    assert row["greedy_identical_share"] == 0.5 and row["greedy_prefix_share"] == 0.75


def test_summary_of_an_older_raw_file_and_its_table():
    """Runs before the run folder wrote {variant: numbers} only: the window and prompt
    count come from the numbers, the model from the caller."""
    old = {
        "bf16": {"ppl": 12.0, "scored_tokens": 2046, "windows": 2, "greedy": [[1, 2]] * 3},
        "x86_int8": {"ppl": 12.12, "scored_tokens": 2046, "windows": 2, "greedy": [[1, 3]] * 3},
    }
    s = quality.summary(old, raw={"commit": "abc1234", "path": "docs/bench/q.json"}, model="m")
    assert (s["model"], s["window"], s["prompts"], s["new_tokens"]) == ("m", 1024, 3, 32)
    assert quality.summary(s) == s
    table = quality.render(s)
    assert "model m; 2046 tokens scored in 2 windows of 1024" in table
    assert "| x86_int8 | 12.120 | +1.00 % | 0 % | 50 % |" in table


def test_bad_model_or_variant_is_one_sentence(capsys, monkeypatch):
    """An unknown model name exits 1 with pull's sentence, no traceback; an unknown
    variant is refused before any model is fetched."""
    from vllm_x86.tools.models import pull

    with pytest.raises(SystemExit) as e:
        quality.main(["--model", "no-such-model"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in err and "Traceback" not in err

    monkeypatch.setattr(pull, "resolve_model", lambda m: pytest.fail("pulled a model"))
    with pytest.raises(SystemExit) as e:
        quality.main(["--variants", "x86_int4,nosuch"])
    assert e.value.code == 2
    assert "unknown variants ['nosuch']" in capsys.readouterr().err
