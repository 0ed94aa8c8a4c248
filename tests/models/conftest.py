"""Options of the model tests.

--arch NAME     run the conformance suite for one architecture (repeatable, or
                comma-separated), e.g. --arch Qwen3ForCausalLM
--modes LIST    the conformance modes to run (default: all of fp32-eager, bf16-eager,
                fp32-compiled, bf16-compiled)
--write-matrix  after the run, render docs/supported_models.md (and .json) from the
                merged results
--conformance-workers N
                vLLM worker processes side by side, each with its share of the cores
                (default 1; a CI machine with cores to spare can use more)
"""

from __future__ import annotations


def pytest_addoption(parser):
    g = parser.getgroup("vllm-x86 conformance")
    g.addoption("--arch", action="append", default=[], help="architecture class name(s)")
    g.addoption("--modes", default="", help="comma-separated conformance modes")
    g.addoption("--write-matrix", action="store_true", help="render docs/supported_models.md after")


def _archs(config) -> list[str]:
    return [n for v in config.getoption("--arch") for n in v.split(",") if n]


def pytest_generate_tests(metafunc):
    if "conformance_case" not in metafunc.fixturenames:
        return
    from vllm_x86.models.archs import ARCHS, BY_NAME, MODES

    names = _archs(metafunc.config) or [a.name for a in ARCHS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"--arch: unknown architecture(s) {unknown}; see vllm_x86/models/archs.py")
    modes = [m for m in metafunc.config.getoption("--modes").split(",") if m] or list(MODES)
    cases = [(n, m) for n in names for m in modes]
    metafunc.parametrize("conformance_case", cases, ids=[f"{n}-{m}" for n, m in cases])
