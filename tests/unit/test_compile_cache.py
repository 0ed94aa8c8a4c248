"""The compile cache's key and its manifest check, on fake artifact directories (the real
thing, a compiled start with a damaged cache entry, is in tests/e2e/test_compile_cache.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from vllm_x86.runtime.startup import compile_cache as cc


def _artifact(root, name="abc123"):
    entry = root / cc.AOT_SUBDIR / name
    (entry / "rank_0_0").mkdir(parents=True)
    (entry / "inductor_cache" / "xy").mkdir(parents=True)
    (entry / "rank_0_0" / "model").write_bytes(b"compiled model bytes" * 100)
    (entry / "inductor_cache" / "xy" / "kernel.so").write_bytes(b"\x7fELF" + b"k" * 500)
    return entry


def test_key_is_computed_without_importing_torch():
    """`vllm-x86 serve` computes the key before it hands over to vLLM's server: importing
    torch there cost 1.2 s of every start."""
    code = (
        "import sys\n"
        "from vllm_x86.runtime.startup import compile_cache as cc\n"
        "print(cc.cache_root())\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    root, imported = out.stdout.splitlines()
    assert imported == "[]"
    assert root == str(cc.cache_root())


def test_key_names_versions_and_isa(monkeypatch):
    f = cc.key_factors()
    assert set(f) == {
        "vllm-x86",
        "vllm",
        "torch",
        "python",
        "cpu_isa",
        "cpu_flags",
        "kernel_isa",
        "runtime",
        "graph_settings",
    }
    import vllm

    assert f["torch"] == torch.__version__ and f["vllm"] == vllm.__version__
    assert "VLLM_X86_DIRECT_ATTENTION=1" in f["graph_settings"]
    other = dict(f, cpu_isa="avx2")
    assert cc.cache_root(f) != cc.cache_root(other)
    assert cc.cache_root(f) == cc.cache_root(dict(f))
    monkeypatch.setenv("VLLM_X86_ISA", "avx2")
    assert cc.key_factors()["kernel_isa"] == "avx2"
    # a setting that changes the traced graph keys another cache
    monkeypatch.setenv("VLLM_X86_DIRECT_ATTENTION", "0")
    assert cc.cache_root() != cc.cache_root(dict(f, kernel_isa="avx2"))
    assert "VLLM_X86_DIRECT_ATTENTION=0" in cc.key_factors()["graph_settings"]


def test_key_follows_the_runtime_code(tmp_path, monkeypatch):
    """The plugin's version stays while its code changes: the key hashes the runtime
    sources, so a changed file is another cache."""
    import shutil

    import vllm_x86.runtime as rt

    src = Path(rt.__file__).parent
    copy = tmp_path / "runtime"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    fake = copy / "startup" / "compile_cache.py"
    monkeypatch.setattr(cc, "__file__", str(fake))
    before = cc.runtime_fingerprint()
    assert before == cc.runtime_fingerprint()
    (copy / "ops" / "attention.py").write_text("# changed\n")
    assert cc.runtime_fingerprint() != before


def test_sealed_entry_passes_and_unsealed_is_left_alone(tmp_path):
    entry = _artifact(tmp_path)
    assert cc.check(tmp_path) == []  # no manifest yet: vLLM's own checks only
    assert cc.seal(tmp_path, "model-x") == 1
    manifest = json.loads((entry / cc.MANIFEST).read_text())
    assert manifest["model"] == "model-x"
    assert set(manifest["files"]) == {"rank_0_0/model", "inductor_cache/xy/kernel.so"}
    assert cc.seal(tmp_path) == 0  # sealed once
    assert cc.check(tmp_path) == []
    assert entry.exists()


def test_an_artifact_rewritten_in_this_start_is_sealed_anew(tmp_path):
    """vLLM compiles again over an artifact it would not load (after a source change)
    and saves to the same directory: the manifest is rewritten, not left stale for the
    next start to take for damage; files older than the start's check keep theirs."""
    import os
    import time

    entry = _artifact(tmp_path)
    assert cc.seal(tmp_path) == 1
    old = (entry / cc.MANIFEST).read_text()
    checked_at = time.time()
    assert cc.seal(tmp_path, written_since=checked_at + 60) == 0  # nothing newer
    assert (entry / cc.MANIFEST).read_text() == old
    (entry / "rank_0_0" / "model").write_bytes(b"recompiled model" * 50)
    os.utime(entry / "rank_0_0" / "model", (checked_at + 1, checked_at + 1))
    assert cc.seal(tmp_path, written_since=checked_at) == 1
    assert cc.check(tmp_path) == [] and entry.exists()
    # without the start's time (an older worker): left as it was, and then caught
    (entry / "rank_0_0" / "model").write_bytes(b"changed again" * 10)
    assert cc.seal(tmp_path) == 0
    assert [name for name, _ in cc.check(tmp_path)] == [entry.name]


def test_damaged_entries_are_moved_aside(tmp_path):
    for name, damage in [
        ("flipped", lambda e: (e / "rank_0_0" / "model").write_bytes(b"X" * 2000)),
        ("truncated", lambda e: (e / "inductor_cache" / "xy" / "kernel.so").write_bytes(b"")),
        ("missing", lambda e: (e / "rank_0_0" / "model").unlink()),
        ("badmanifest", lambda e: (e / cc.MANIFEST).write_text("{not json")),
    ]:
        entry = _artifact(tmp_path, name)
        cc.seal(tmp_path)
        damage(entry)
    good = _artifact(tmp_path, "good")
    cc.seal(tmp_path)
    moved = dict(cc.check(tmp_path))
    assert set(moved) == {"flipped", "truncated", "missing", "badmanifest"}
    assert "SHA-256" in moved["flipped"]
    assert "bytes" in moved["truncated"]
    assert "missing" in moved["missing"]
    assert "manifest" in moved["badmanifest"]
    assert good.exists() and not (tmp_path / cc.AOT_SUBDIR / "flipped").exists()
    quarantined = list((tmp_path / "quarantine").iterdir())
    assert len(quarantined) == cc.KEEP_QUARANTINED  # the oldest are dropped
    assert all((q / "quarantine-reason.txt").exists() for q in quarantined)


def test_short_warm_up_needs_a_compiled_model_in_vllms_cache(monkeypatch):
    """Eager mode, the setting off, or a runner without compiled modules keep vLLM's
    warm-up (the cached case is tests/e2e/test_compile_cache.py)."""
    import types

    from vllm.config import CompilationMode

    from vllm_x86.runtime.worker import cached_compiled_model

    def cfg(mode):
        return types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(mode=mode),
            parallel_config=types.SimpleNamespace(
                pipeline_parallel_size=1, rank=0, data_parallel_index=0
            ),
        )

    plain = types.SimpleNamespace(
        supports_mm_inputs=False, model=torch.nn.Sequential(torch.nn.Linear(2, 2))
    )
    assert not cached_compiled_model(plain, cfg(CompilationMode.NONE))
    assert not cached_compiled_model(plain, cfg(CompilationMode.VLLM_COMPILE))  # nothing compiled
    monkeypatch.setenv("VLLM_X86_SHORT_WARMUP", "0")
    assert not cached_compiled_model(plain, cfg(CompilationMode.VLLM_COMPILE))
