"""When staged warm-up applies (staged.enabled); the real thing, a compiled server
switching from eager to compiled, is tests/e2e/test_staged_warmup.py."""

from __future__ import annotations

import pytest

from vllm_x86.runtime.startup import staged


@pytest.mark.parametrize(
    "setting, serve, want",
    [
        (None, "1", True),  # auto: `vllm-x86 serve` and its daemon (VLLM_X86_SERVE_DEFAULTS=1)
        (None, None, False),  # auto: the LLM class, vLLM's own server
        (None, "0", False),
        ("auto", "1", True),
        ("1", None, True),
        ("0", "1", False),
    ],
)
def test_enabled(monkeypatch, setting, serve, want):
    for name, value in (("VLLM_X86_STAGED_WARMUP", setting), ("VLLM_X86_SERVE_DEFAULTS", serve)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert staged.enabled() is want


def test_compiled_modules_are_the_ones_vllm_would_compile():
    import torch

    class Compiled(torch.nn.Module):  # what support_torch_compile leaves on a module
        was_aot_compile_fn_loaded_from_disk = False
        do_not_compile = False

    class Off(Compiled):
        do_not_compile = True

    model = torch.nn.Sequential(Compiled(), Off(), torch.nn.Linear(2, 2))
    assert [type(m) for m in staged.compiled_modules(model)] == [Compiled]


def test_not_staged_with_several_workers_or_compiled_modules(monkeypatch):
    """Nothing is forked (os.fork would fail the test) and nothing is switched to eager."""
    from types import SimpleNamespace

    import torch

    class Compiled(torch.nn.Module):
        was_aot_compile_fn_loaded_from_disk = False

        def __init__(self):
            super().__init__()
            self.do_not_compile = False

    def worker(model, world):
        pc = SimpleNamespace(world_size_across_dp=world)
        return SimpleNamespace(
            model_runner=SimpleNamespace(model=model),
            vllm_config=SimpleNamespace(parallel_config=pc),
        )

    monkeypatch.setattr(staged.os, "fork", lambda: pytest.fail("forked"))
    one = torch.nn.Sequential(Compiled())
    assert staged.StagedCompile.start(worker(one, world=2)) is None  # tensor parallel
    two = torch.nn.Sequential(Compiled(), Compiled())
    assert staged.StagedCompile.start(worker(two, world=1)) is None  # encoder + decoder
    assert staged.StagedCompile.start(worker(torch.nn.Linear(2, 2), world=1)) is None
    assert not any(m.do_not_compile for m in [*one, *two])


def _child(code: int) -> int:
    """A real child process that exits with `code` (the compile process's place)."""
    import os

    pid = os.fork()
    if pid == 0:
        os._exit(code)
    return pid


@pytest.fixture
def module():
    import torch

    class Compiled(torch.nn.Module):
        was_aot_compile_fn_loaded_from_disk = False

        def __init__(self):
            super().__init__()
            self.do_not_compile = True  # as start() leaves it: serving eagerly

    return Compiled()


def _waited(sc) -> None:
    import time

    deadline = time.monotonic() + 10
    while not sc.done:
        assert time.monotonic() < deadline
        sc.poll()
        time.sleep(0.01)


def test_a_failed_compile_keeps_serving_eagerly(module, caplog):
    sc = staged.StagedCompile(worker=None, pid=_child(3), modules=[module])
    _waited(sc)
    assert module.do_not_compile is True and sc.switched_at is None
    assert "the background compile failed (exit code 3" in caplog.text


def test_a_finished_compile_switches_once_the_artifact_is_there(module, monkeypatch, caplog):
    from types import SimpleNamespace

    seen = []

    def in_cache(runner, cfg):
        seen.append(module.do_not_compile)  # asked with the module compiled again
        return found

    monkeypatch.setattr(staged, "compiled_model_in_cache", in_cache)
    caplog.set_level("INFO", logger=staged.logger.name)
    fake = SimpleNamespace(model_runner=None, vllm_config=None)
    found = False  # exit 0 but no artifact: stays eager
    sc = staged.StagedCompile(worker=fake, pid=_child(0), modules=[module])
    _waited(sc)
    assert seen == [False] and module.do_not_compile is True
    assert "its compiled model is not in vLLM's cache; serving eagerly" in caplog.text
    found = True
    sc = staged.StagedCompile(worker=fake, pid=_child(0), modules=[module])
    _waited(sc)
    assert module.do_not_compile is False and sc.switched_at is not None
    sc.after_step()  # the step that loaded it is reported once
    assert sc.switched_at is None
    assert "serving the compiled model (the step that loaded it took" in caplog.text
