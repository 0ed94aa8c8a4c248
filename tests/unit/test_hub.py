"""A hub id means that hub model: `vllm-x86 serve org/name` serves the snapshot in the
local Hugging Face cache under the hub id, or stops before vLLM starts with a sentence
that says how to get it (and names the catalog's build of it). The cache here is a fake
one in tmp_path, in the hub's layout: models--org--name/{refs/main, snapshots/<commit>/}.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.cli.common import CliError, resolve_serve_model, serve_argv
from vllm_x86.tools.models import hub
from vllm_x86.tools.models import pull as pull_mod

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def cache_model(cache: Path, repo_id: str, commit: str = COMMIT, ref: str = "main") -> Path:
    """A model snapshot in the hub cache layout; returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_hub_id_is_served_from_the_local_cache_under_its_id(hf_cache):
    snap = cache_model(hf_cache, "Org/Tiny")
    assert resolve_serve_model("Org/Tiny") == (str(snap), "Org/Tiny")
    argv, host, port = serve_argv("Org/Tiny", ["--port", "8123"])
    assert argv[argv.index("--model") + 1] == str(snap)  # vLLM never sees the hub id
    assert argv[argv.index("--served-model-name") + 1] == "Org/Tiny"
    assert (host, port) == ("127.0.0.1", 8123)


def test_hub_id_of_a_catalog_model_means_the_hub_model(hf_cache, monkeypatch):
    """The hub id the catalog's Qwen build was made from serves Qwen's own snapshot,
    not the catalog's dequantized GGUF (nothing is pulled)."""
    monkeypatch.setattr(pull_mod, "pull", lambda *a, **k: pytest.fail("pulled a catalog model"))
    snap = cache_model(hf_cache, "Qwen/Qwen2.5-Coder-0.5B-Instruct")
    got = resolve_serve_model("Qwen/Qwen2.5-Coder-0.5B-Instruct")
    assert got == (str(snap), "Qwen/Qwen2.5-Coder-0.5B-Instruct")


def test_missing_hub_id_says_how_to_get_it(hf_cache):
    with pytest.raises(CliError) as e:
        resolve_serve_model("Org/Missing")
    assert str(e.value) == (
        f"Org/Missing is not in the local Hugging Face cache ({hf_cache}), and vllm-x86 does "
        "not download from the hub. Download it on a machine that can reach the hub (`hf "
        "download Org/Missing`) and copy the cache folder here (or point HF_HUB_CACHE at it), "
        "or give a local model directory. Models vllm-x86 can fetch without the hub: "
        "`vllm-x86 pull --list`."
    )


def test_missing_hub_id_names_the_catalog_build_of_it(hf_cache):
    with pytest.raises(CliError) as e:
        resolve_serve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    msg = str(e.value)
    assert msg.startswith("HuggingFaceTB/SmolLM2-135M-Instruct is not in the local Hugging Face")
    assert msg.endswith(
        "The catalog has a GGUF Q4_1 build of it, dequantized to bf16 (close to the original "
        "weights, not equal): `vllm-x86 serve smollm2-135m-instruct-q4_1` (all catalog "
        "models: `vllm-x86 pull --list`)."
    )


def test_revision_picks_the_snapshot(hf_cache):
    cache_model(hf_cache, "Org/Tiny")
    tagged = cache_model(hf_cache, "Org/Tiny", commit=OTHER, ref="v2")
    argv, _, _ = serve_argv("Org/Tiny", ["--revision", "v2", "--dtype", "bfloat16"])
    assert argv[argv.index("--model") + 1] == str(tagged)
    assert "--revision" not in argv and argv[-2:] == ["--dtype", "bfloat16"]
    with pytest.raises(CliError, match=r"^Org/Tiny at revision v3 is not in the local"):
        serve_argv("Org/Tiny", ["--revision=v3"])


def test_incomplete_snapshot_is_refused(hf_cache):
    snap = cache_model(hf_cache, "Org/Half")
    (snap / "config.json").unlink()
    with pytest.raises(CliError, match=r"has Org/Half .* without config.json: an incomplete"):
        resolve_serve_model("Org/Half")


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.hf_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.hf_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub.hf_cache_dir() == tmp_path / "hf" / "hub"
    snap = cache_model(tmp_path / "hf" / "hub", "Org/Tiny")
    assert resolve_serve_model("Org/Tiny") == (str(snap), "Org/Tiny")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.hf_cache_dir() == tmp_path / "elsewhere"


def test_what_counts_as_a_hub_id():
    for ok in ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "org/name", "gpt2", "a_b/c.d"):
        assert hub.is_repo_id(ok), ok
    for bad in ("a/b/c", "/abs/path", "org/", "-org/name", "org/name-", "a--b/c", "a/b..c", ""):
        assert not hub.is_repo_id(bad), bad


def test_catalog_name_is_served_under_its_own_name(monkeypatch, tmp_path):
    monkeypatch.setattr(pull_mod, "pull", lambda name=None, force=False: tmp_path / name)
    got = resolve_serve_model("SmolLM2-135M-Instruct-Q4_1")
    assert got == (str(tmp_path / "smollm2-135m-instruct-q4_1"), "smollm2-135m-instruct-q4_1")
    assert resolve_serve_model(None)[1] == "smollm2-135m-instruct-q4_1"  # the default


def test_former_and_unknown_names_fail_clearly(hf_cache):
    with pytest.raises(CliError, match=r"^'gemma-3-270m' is the former name of the catalog "):
        resolve_serve_model("gemma-3-270m")
    with pytest.raises(CliError) as e:
        resolve_serve_model("no-such-model")
    assert str(e.value).startswith(
        f"unknown model 'no-such-model': no catalog name, directory or model in the local "
        f"Hugging Face cache ({hf_cache}). Catalog names (`vllm-x86 pull --list`): "
    )
    with pytest.raises(CliError, match=r"^model path 'a/b/c' does not exist"):
        resolve_serve_model("a/b/c")


def test_cli_serve_of_a_missing_hub_id_exits_before_vllm(hf_cache):
    """As a user runs it: exit code 1, the sentence on stderr, no traceback, no server."""
    p = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "serve", "Org/Missing", "--no-daemon"],
        env=clean_env(HF_HUB_CACHE=str(hf_cache), HF_HUB_OFFLINE="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1
    assert p.stderr.startswith(
        f"vllm-x86: error: Org/Missing is not in the local Hugging Face cache ({hf_cache})"
    )
    assert "hf download Org/Missing" in p.stderr
    assert "Traceback" not in p.stderr and "serving" not in p.stderr
