"""The speculative-decoding benchmark's choices (vllm_x86/tools/bench/speculative.py): which
server contender both servers run as, and the `--speculative-config` of the 'on' server
(n-gram by default; a draft model quantized like the model it drafts for)."""

from __future__ import annotations

import json

import pytest

from vllm_x86.tools.bench.contenders import BenchError
from vllm_x86.tools.bench.speculative import base_contender, build_parser, on_config


def _ns(*argv):
    return build_parser().parse_args(list(argv))


def test_default_is_the_plugin_server_with_ngram():
    ns = _ns()
    base = base_contender(ns)
    assert base.name == "plugin" and base.quantization is None
    cfg = json.loads(on_config(ns, base))
    assert cfg["method"] == "ngram" and cfg["num_speculative_tokens"] == 4


def test_a_draft_model_is_quantized_like_the_contender(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    ns = _ns("--contender", "plugin-int4-head", "--draft", str(tmp_path))
    base = base_contender(ns)
    assert base.args == ("--quantization", "x86_int4")
    assert base.env == {"VLLM_X86_QUANT_LM_HEAD": "1"}
    cfg = json.loads(on_config(ns, base))
    assert cfg == {
        "method": "draft_model",
        "model": str(tmp_path.resolve()),
        "num_speculative_tokens": 3,
        "quantization": "x86_int4",
    }
    # an unquantized contender leaves the draft unquantized
    plain = json.loads(on_config(_ns("--draft", str(tmp_path)), base_contender(_ns())))
    assert "quantization" not in plain
    # the user's own JSON wins over both
    own = '{"method": "ngram", "num_speculative_tokens": 2}'
    assert on_config(_ns("--speculative-config", own, "--draft", str(tmp_path)), base) == own


def test_contender_choice_errors_say_what_to_use():
    with pytest.raises(BenchError, match="'llamacpp' is not a server contender: use one of"):
        base_contender(_ns("--contender", "llamacpp"))
    with pytest.raises(BenchError, match="'nope' is not a server contender"):
        base_contender(_ns("--contender", "nope"))
    with pytest.raises(BenchError, match="--stock runs stock vLLM's server"):
        base_contender(_ns("--stock", "--contender", "plugin-int8"))
    assert base_contender(_ns("--stock")).name == "stock"
