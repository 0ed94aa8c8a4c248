"""Shared fixtures. Tests that start an engine, a server or a model are marked slow;
`make test-fast` runs the rest in about a minute.

`make test` runs the suite on several pytest-xdist workers (`-n`, one module per
worker at a time: `--dist loadscope --no-loadscope-reorder`). Most of the suite's time
is single-threaded (imports, engine start, Python), which is what the workers overlap.
The workers are not pinned to CPUs: an engine keeps the plugin's thread layout for the
whole machine. Measured on 2 cores: 15.4 min against 18.5 min with each worker (and
everything it starts) pinned to one core, which idles a core whenever the other worker
waits.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).resolve().parent / "helpers"
PYTHON = sys.executable

# Modules that take minutes go first, so that under xdist's loadscope (in collection
# order: make test passes --no-loadscope-reorder, else xdist orders modules by their
# number of tests) they start at once on a worker of their own instead of ending the
# run alone. The e2e modules, also long, come next in collection order; unit tests last.
FIRST = ("tests/models/test_conformance.py", "tests/models/test_default_model_parity.py")


# the seed of the CI run that found the unspellable-choice 500 (docs/reliability.md)
FUZZ_SEED = "317185502500810454041081930560280935466"


def pytest_addoption(parser):
    # Here, not in tests/e2e/conftest.py: pytest reads options only from the conftest
    # files it loads at start, and a plain `pytest` loads this one.
    group = parser.getgroup("vllm-x86")
    group.addoption(
        "--fuzz-seconds",
        type=float,
        default=75.0,
        help="time budget of the Schemathesis run in tests/e2e/test_fuzz.py (default 75 s, "
        "the `make test` run; `make fuzz` raises it)",
    )
    group.addoption(
        "--fuzz-seed",
        default=FUZZ_SEED,
        help="Schemathesis' seed in tests/e2e/test_fuzz.py: fixed by default, so `make "
        "test` replays the same requests (as many as its time allows) and a CI failure "
        "is a regression; 'random' (what `make fuzz` passes) looks for new problems",
    )
    group.addoption(
        "--fuzz-wide",
        action="store_true",
        help="tests/e2e/test_fuzz.py: every endpoint but those it excludes, and "
        "Schemathesis' coverage phase before its fuzzing (for `make fuzz`)",
    )


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        try:
            path = Path(str(item.fspath)).relative_to(ROOT).as_posix()
        except ValueError:
            return len(FIRST)
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: the order within a module stays


@pytest.fixture(autouse=True)
def _restore_environ():
    """Each test gets the process environment the previous one started with: in-process
    engines and platform code set variables (the plugin's VLLM_CACHE_ROOT, for one) that
    would otherwise reach the servers later tests start from the same worker."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The default model (SmolLM2-135M-Instruct), pulled and converted once."""
    from vllm_x86.tools.models.pull import pull

    return pull()


@pytest.fixture
def free_port() -> int:
    from vllm_x86.tools.ports import free_port as pick

    return pick()


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any VLLM_X86_* / VLLM_CPU_* setting
    (so a developer's shell does not change what a test measures), plus `extra`.
    VLLM_X86_CACHE_DIR stays: it says where the models are, not how they run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "VLLM_X86_CACHE_DIR" or not k.startswith(("VLLM_X86_", "VLLM_CPU_"))
    }
    env.update(extra)
    return env
