"""Compiling ahead at pull (tools/models/compile_ahead.py): the marker, its checks, and
what pull does with it. The real compile runs in tests/e2e/test_demo.py."""

from __future__ import annotations

import json

import pytest

from vllm_x86.tools.models import compile_ahead as ca


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "compile" / "key"
    monkeypatch.setattr(ca, "_cache_root", lambda: root)
    return root


def _artifact(root, name="abc123", manifest=True):
    d = root / ca.AOT_SUBDIR / name
    (d / "rank_0_0").mkdir(parents=True)
    if manifest:
        (d / ca.MANIFEST).write_text("{}")
    return d


def _mark(model_dir, root, name="abc123"):
    model_dir.mkdir(exist_ok=True)
    (model_dir / ca.MARKER).write_text(
        json.dumps(
            {
                "cache_root": str(root),
                "runtime": ca.runtime_fingerprint(),
                "artifact": name,
                "serve_args": [],
            }
        )
    )


def test_no_marker_means_not_compiled(tmp_path, cache):
    _artifact(cache)
    assert ca.compiled_artifact(tmp_path) is None


def test_marker_with_its_sealed_artifact_is_found(tmp_path, cache):
    d = _artifact(cache)
    _mark(tmp_path / "m", cache)
    assert ca.compiled_artifact(tmp_path / "m") == d


@pytest.mark.parametrize(
    "case", ["artifact-gone", "no-manifest", "other-install", "other-code", "damaged-marker"]
)
def test_marker_that_no_longer_holds_is_ignored(tmp_path, cache, case):
    model = tmp_path / "m"
    if case == "artifact-gone":
        _mark(model, cache)
    elif case == "no-manifest":  # a start that never finished sealing it
        _artifact(cache, manifest=False)
        _mark(model, cache)
    elif case == "other-install":  # compiled by another plugin, vLLM, torch or CPU
        _artifact(cache)
        _mark(model, cache.parent / "otherkey")
    elif case == "other-code":  # the plugin's runtime code changed since
        _artifact(cache)
        _mark(model, cache)
        data = json.loads((model / ca.MARKER).read_text())
        (model / ca.MARKER).write_text(json.dumps(dict(data, runtime="0" * 16)))
    else:
        _artifact(cache)
        model.mkdir()
        (model / ca.MARKER).write_text("{not json")
    assert ca.compiled_artifact(model) is None


@pytest.mark.parametrize(
    "said", ["Directly load AOT compilation from path", "saved AOT compiled function to"]
)
def test_entry_named_in_vllms_load_or_save_message(said):
    # The save line names the entry when a compile rewrote one that existed before
    # (left without its model by an interrupted start): no new directory appears then.
    line = (
        f"[backbone] {said} /c/compile/k/torch_compile_cache/torch_aot_compile/ab12/rank_0_0/model"
    )
    (path,) = ca._LOADED.findall(line)
    assert ca._entry_of(path) == "ab12"
    assert ca._entry_of("/elsewhere/model") is None


def test_compile_ahead_does_nothing_when_already_compiled(tmp_path, cache, monkeypatch, capfd):
    d = _artifact(cache)
    _mark(tmp_path / "m", cache)
    monkeypatch.setattr(ca.subprocess, "Popen", lambda *a, **k: pytest.fail("started a server"))
    assert ca.compile_ahead("some-model", tmp_path / "m") == d
    assert "already compiled for this machine" in capfd.readouterr().err


def test_a_second_compile_waits_for_the_first_and_loads_it(tmp_path, cache, monkeypatch, capfd):
    """While another process holds the model's compile lock, compile_ahead waits, then
    finds what that run compiled and starts no server of its own."""
    import fcntl
    import threading

    model = tmp_path / "m"
    model.mkdir()
    monkeypatch.setattr(ca.subprocess, "Popen", lambda *a, **k: pytest.fail("started a server"))
    other = open(model / ca.LOCK, "a")  # the other run's lock (another open file: flock
    fcntl.flock(other, fcntl.LOCK_EX)  # excludes it as it would another process)
    got = {}
    t = threading.Thread(target=lambda: got.update(d=ca.compile_ahead("some-model", model)))
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive(), "it did not wait for the lock"
    d = _artifact(cache)  # what the other run compiled and recorded
    _mark(model, cache)
    fcntl.flock(other, fcntl.LOCK_UN)
    other.close()
    t.join(timeout=10)
    assert not t.is_alive() and got["d"] == d
    err = capfd.readouterr().err
    assert "another process is compiling some-model; waiting for it to finish" in err
    assert "compiled meanwhile by the other run" in err


def test_compile_run_that_dies_is_a_sentence(tmp_path, cache, monkeypatch):
    """A server that exits before it is ready: CompileAheadError naming the log and
    saying the first serve compiles in the background."""
    monkeypatch.setattr(ca.sys, "executable", "/bin/false")
    with pytest.raises(ca.CompileAheadError) as e:
        ca.compile_ahead("some-model", tmp_path, timeout=30)
    msg = str(e.value)
    assert "exited with code 1 before the model was ready" in msg
    assert "the first `vllm-x86 serve` will compile in the background" in msg
    assert not (tmp_path / ca.MARKER).exists()


def test_pull_compiles_unless_told_not_to(monkeypatch, tmp_path, capfd):
    from vllm_x86.tools.cli import main as cli_main
    from vllm_x86.tools.models import pull as pull_mod

    monkeypatch.setattr(pull_mod, "pull", lambda name=None, force=False: tmp_path)
    calls = []
    monkeypatch.setattr(ca, "can_compile", lambda: None)
    monkeypatch.setattr(ca, "compile_ahead", lambda name, path: calls.append((name, path)))
    assert cli_main.main(["pull", "smollm2-135m-instruct-q4_1"]) == 0
    assert calls == [("smollm2-135m-instruct-q4_1", tmp_path)]
    assert cli_main.main(["pull", "smollm2-135m-instruct-q4_1", "--no-compile"]) == 0
    assert len(calls) == 1

    # a failed compile is a warning: the model is pulled, exit 0, its path on stdout
    def fail(name, path):
        raise ca.CompileAheadError("the compile run exited with code 1")

    monkeypatch.setattr(ca, "compile_ahead", fail)
    capfd.readouterr()
    assert cli_main.main(["pull"]) == 0
    out, err = capfd.readouterr()
    assert out.strip() == str(tmp_path)
    assert "vllm-x86: warning: the compile run exited with code 1" in err
    # no compiler: said, not tried
    monkeypatch.setattr(ca, "can_compile", lambda: "no C++ compiler")
    assert cli_main.main(["pull"]) == 0
    assert "not compiling ahead: no C++ compiler" in capfd.readouterr().err


def test_serve_says_which_mode_and_why(tmp_path, cache):
    """`vllm-x86 serve` logs its mode with the reason: eager and why, compiled from the
    first request where the model was compiled ahead for these settings, otherwise
    compiled after a staged start."""
    from vllm_x86.tools.cli.main import _mode_note

    model = tmp_path / "m"
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    assert _mode_note(argv + ["--enforce-eager"], ["--enforce-eager"]) == (
        "vllm-x86: eager mode (--enforce-eager)"
    )
    assert _mode_note(argv + ["--enforce-eager"], []) == "vllm-x86: eager mode (no C++ compiler)"
    staged = _mode_note(argv, [])
    assert staged.startswith("vllm-x86: vLLM's compiled mode, measured faster than eager")
    assert "serves eagerly while it compiles in the background" in staged
    _artifact(cache)
    _mark(model, cache)
    ahead = _mode_note(argv, ["--port", "8001"])
    assert ahead.endswith("compiled from the first request (compiled ahead for this machine)")
    # another max length is another compile-cache key: not what was compiled ahead
    assert "compiles in the background" in _mode_note(argv, ["--max-model-len", "512"])
    assert _mode_note(argv, ["-O0"]) == (
        "vllm-x86: vLLM's compiled mode with the compilation settings you gave"
    )
    # several ranks: no staged warm-up, each rank compiles before the server answers
    for flags in (["--tensor-parallel-size", "2"], ["-pp", "2"]):
        note = _mode_note(argv, flags)
        assert "each of the 2 ranks compiles" in note and "background" not in note, note
