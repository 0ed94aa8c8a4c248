"""The platform's start-up defaults on a real vLLM config (no engine): the keyed compile
cache, vLLM CPU's spawn outside `vllm-x86 serve`, and that the user's own settings win."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, clean_env

pytestmark = pytest.mark.slow  # each case imports vLLM in a fresh process (~10 s)

CODE = r"""
import json, os, sys
from vllm.engine.arg_utils import EngineArgs
kw = json.loads(sys.argv[2])
EngineArgs(model=sys.argv[1], max_model_len=1024, **kw).create_engine_config()
print("ENV " + json.dumps({k: os.environ.get(k) for k in
      ("VLLM_CACHE_ROOT", "VLLM_WORKER_MULTIPROC_METHOD")}))
"""


def _config_env(model, engine_kwargs, **env) -> dict:
    p = subprocess.run(
        [PYTHON, "-c", CODE, str(model), json.dumps(engine_kwargs)],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    for line in p.stdout.splitlines():
        if line.startswith("ENV "):
            return json.loads(line[4:]) | {"log": p.stdout + p.stderr}
    raise AssertionError(p.stderr[-3000:])


def test_defaults_in_compiled_mode(default_model, tmp_path):
    env = _config_env(default_model, {}, VLLM_X86_CACHE_DIR=str(tmp_path))
    root = Path(env["VLLM_CACHE_ROOT"])
    assert root.parent == tmp_path / "compile" and (root / "key.json").exists()
    assert json.loads((root / "key.json").read_text())["vllm-x86"]
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # vLLM CPU's own, outside a daemon


def test_eager_leaves_the_cache_and_the_users_cache_root_wins(default_model, tmp_path):
    env = _config_env(default_model, {"enforce_eager": True}, VLLM_X86_CACHE_DIR=str(tmp_path))
    assert env["VLLM_CACHE_ROOT"] is None  # eager: nothing compiled, nothing moved
    env = _config_env(default_model, {}, VLLM_CACHE_ROOT=str(tmp_path / "mine"))
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "mine")
    assert "not keyed or checked by the plugin" in env["log"]
