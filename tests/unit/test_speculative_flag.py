"""`vllm-x86 serve --speculative`: its translation into vLLM's --speculative-config
(tools/cli/speculative.py), the setting VLLM_X86_SPECULATIVE, and the user's own vLLM
flags winning over both."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.cli.common import CliError
from vllm_x86.tools.cli.speculative import NGRAM_DEFAULTS, speculative_args


def _config(argv: list[str]) -> dict:
    assert argv.count("--speculative-config") == 1, argv
    return json.loads(argv[argv.index("--speculative-config") + 1])


@pytest.mark.parametrize("flag", [["--speculative", "ngram"], ["--speculative=ngram"]])
def test_ngram_flag_becomes_vllms_speculative_config(flag):
    argv, note = speculative_args(["--port", "8001", *flag, "--enforce-eager"], None)
    assert argv[:3] == ["--port", "8001", "--enforce-eager"]
    assert not any(a.startswith("--speculative=") or a == "--speculative" for a in argv)
    assert _config(argv) == {"method": "ngram", **NGRAM_DEFAULTS}
    assert "speculative decoding on (--speculative ngram)" in note


def test_default_is_off_and_says_why():
    argv, note = speculative_args(["--port", "8001"], None)
    assert argv == ["--port", "8001"]
    assert "speculative decoding off (the default" in note
    assert "--speculative ngram turns it on" in note


def test_setting_turns_it_on_and_the_flag_wins_over_the_setting():
    argv, note = speculative_args([], "ngram")
    assert _config(argv)["method"] == "ngram"
    assert "(VLLM_X86_SPECULATIVE ngram)" in note
    argv, note = speculative_args(["--speculative", "off"], "ngram")
    assert argv == []
    assert "off (--speculative off)" in note
    argv, _ = speculative_args([], "")  # set but empty: the default
    assert argv == []


@pytest.mark.parametrize(
    "own",
    [
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
        ['--speculative-config={"method": "ngram"}'],
        ["-sc", '{"method": "ngram"}'],
        ["--speculative-config.method", "ngram"],
        ["--spec-method", "ngram"],
    ],
)
def test_users_own_vllm_flags_win(own):
    argv, note = speculative_args(["--speculative", "ngram", *own], None)
    assert argv == own  # unchanged, nothing added
    assert "as your" in note and "is ignored: your vLLM flag wins" in note
    argv, note = speculative_args(own, "ngram")
    assert argv == own


def test_bad_values_fail_with_a_sentence():
    with pytest.raises(CliError, match="'eagle' is not a speculative decoding choice"):
        speculative_args(["--speculative", "eagle"], None)
    with pytest.raises(CliError, match="VLLM_X86_SPECULATIVE='yes'"):
        speculative_args([], "yes")
    with pytest.raises(CliError, match="--speculative needs a value"):
        speculative_args(["--speculative"], None)


def test_serve_refuses_a_bad_choice_without_a_traceback():
    p = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "serve", "--speculative", "eagle", "--no-daemon"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1
    assert "vllm-x86: error: --speculative='eagle' is not a speculative decoding choice" in (
        p.stderr
    )
    assert "Traceback" not in p.stderr


_NUMBA_SHRINK = """
import os, sys, types
import torch
torch.set_num_threads(2)
os.sched_setaffinity(0, {0})  # vLLM's binding pins the model's main thread to one CPU
assert torch.get_num_threads() == 2  # PyTorch's threads set up, as in a worker by now
fix = sys.argv[1] == "fix"
if fix:
    from vllm_x86.runtime.worker import _keep_threads_after_ngram
    _keep_threads_after_ngram(types.SimpleNamespace(speculative_config=types.SimpleNamespace(method="ngram")), 2)
import numpy as np
from numba import get_num_threads, njit, prange, set_num_threads

@njit(parallel=True)
def total(a):
    s = 0.0
    for i in prange(a.shape[0]):
        s += a[i]
    return s

n = get_num_threads()  # as vLLM's n-gram proposer does for every batch
set_num_threads(1)
total(np.ones(8))
set_num_threads(n)
print(torch.get_num_threads())
"""


@pytest.mark.slow  # fresh interpreters importing torch, numba and (with the fix) vLLM
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_ngram_proposer_numba_leaves_the_model_its_threads():
    """numba, imported on a thread pinned to one CPU, sets OpenMP's thread count of that
    thread to 1 when its pool starts (what vLLM's n-gram proposer does to the model's
    thread); the worker's fix starts the pool early and sets the count back."""

    def threads(mode: str) -> int:
        p = subprocess.run(
            [PYTHON, "-c", _NUMBA_SHRINK, mode], env=clean_env(), capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        return int(p.stdout.strip().splitlines()[-1])

    assert threads("plain") == 1  # the behaviour the fix exists for
    assert threads("fix") == 2


def _model_dir(path):
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def test_draft_model_is_quantized_as_the_served_model(tmp_path):
    draft = _model_dir(tmp_path / "Draft-0.5B")  # a directory, its case kept
    argv, note = speculative_args(
        ["--quantization", "x86_int4", "--speculative", f"draft:{draft}"], None
    )
    assert argv[:2] == ["--quantization", "x86_int4"]
    assert _config(argv) == {
        "method": "draft_model",
        "model": str(draft),
        "num_speculative_tokens": 3,
        "quantization": "x86_int4",
    }
    assert f"speculative decoding on (--speculative draft:{draft})" in note
    assert "quantized as the model (x86_int4)" in note
    # the setting takes the same, and an unquantized model gets an unquantized draft
    argv, note = speculative_args([], f"draft:{draft}")
    assert "quantization" not in _config(argv) and "(VLLM_X86_SPECULATIVE draft:" in note
    # the user's own vLLM flag wins
    own = ["--speculative-config", '{"method": "ngram"}']
    argv, note = speculative_args(["--speculative", f"draft:{draft}", *own], None)
    assert argv == own and "is ignored: your vLLM flag wins" in note


def test_a_draft_that_is_not_there_fails_with_a_sentence(tmp_path):
    with pytest.raises(CliError, match="names no draft model: give one after 'draft:'"):
        speculative_args(["--speculative", "draft:"], None)
    with pytest.raises(CliError, match=r"^--speculative draft:nope-model: unknown model"):
        speculative_args(["--speculative", "draft:nope-model"], None)
    with pytest.raises(CliError, match="is a directory but not a model"):
        speculative_args(["--speculative", f"draft:{tmp_path}"], None)
