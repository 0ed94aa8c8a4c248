"""Options of the model tests.

--arch NAME     run the conformance suite for one architecture (repeatable, or
                comma-separated), e.g. --arch Qwen3ForCausalLM
--modes LIST    the conformance modes to run, comma-separated, or "all" (default:
                fp32-eager for every architecture, bf16-eager for those of archs.py
                BF16_CI_ARCHS (each bf16 op path once), and int8-eager,int4-eager for
                the few of QUANT_CI_ARCHS, which fits the CI budget of 15 minutes on 2
                cores; compiled mode costs 8-20 s of Inductor per case). Modes named
                here, and with --arch the default ones, run for every architecture
                chosen.
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
    g.addoption("--conformance-workers", type=int, default=1, help="vLLM worker processes")


def _archs(config) -> list[str]:
    return [n for v in config.getoption("--arch") for n in v.split(",") if n]


DEFAULT_MODES = ("fp32-eager", "bf16-eager")


def conformance_modes(config) -> tuple[str, ...]:
    from vllm_x86.tools.conformance.archs import MODES, QUANT_MODES

    raw = config.getoption("--modes")
    if raw == "all":
        return MODES
    if not raw:
        return DEFAULT_MODES + QUANT_MODES
    modes = tuple(m for m in raw.split(",") if m)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"--modes: unknown mode(s) {bad}; known: {', '.join(MODES)}")
    return modes


def conformance_mode_archs(config) -> dict[str, set[str]]:
    """Modes restricted to some architectures: without --modes or --arch, bf16 eager
    runs for BF16_CI_ARCHS only and the quantized ones for QUANT_CI_ARCHS only
    (run_suite's `mode_archs`); architectures named with --arch run every default mode."""
    from vllm_x86.tools.conformance.archs import BF16_CI_ARCHS, QUANT_CI_ARCHS, QUANT_MODES

    if config.getoption("--modes") or _archs(config):
        return {}
    return {"bf16-eager": set(BF16_CI_ARCHS)} | {m: set(QUANT_CI_ARCHS) for m in QUANT_MODES}


def pytest_generate_tests(metafunc):
    if "conformance_case" not in metafunc.fixturenames:
        return
    from vllm_x86.tools.conformance.archs import ARCHS, BY_NAME

    names = _archs(metafunc.config) or [a.name for a in ARCHS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(
            f"--arch: unknown architecture(s) {unknown}; see vllm_x86/tools/conformance/archs.py"
        )
    modes = conformance_modes(metafunc.config)
    only = conformance_mode_archs(metafunc.config)
    cases = [(n, m) for n in names for m in modes if m not in only or n in only[m]]
    metafunc.parametrize("conformance_case", cases, ids=[f"{n}-{m}" for n, m in cases])
