"""Conformance: each architecture of vllm_x86/tools/conformance/archs.py, as a tiny random-weight
checkpoint, through vLLM with the plugin, against transformers on the same token ids.

One vLLM worker process runs every case of the session one after another (the
checkpoints and the transformers references are cached under VLLM_X86_CACHE_DIR/tiny),
then each case asserts its verdict: greedy tokens and log-probabilities as
vllm_x86/tools/conformance/conformance.py defines them (tolerances there and in
docs/supported_models.md). A case that archs.py marks as failing, with the reason, is
an xfail; one that passes anyway fails the suite until the table is updated.

    pytest tests/models/test_conformance.py -m slow                   # eager: fp32 for all,
                                              # bf16 for archs.py BF16_CI_ARCHS (each
                                              # bf16 op path once), INT8/INT4 for the
                                              # few of QUANT_CI_ARCHS
    pytest tests/models/test_conformance.py -m slow --modes fp32-eager,bf16-eager
                                              # the whole bf16 column
    pytest tests/models/test_conformance.py -m slow --modes all       # + compiled
    pytest tests/models/test_conformance.py -m slow --arch Qwen3ForCausalLM
    pytest tests/models/test_conformance.py -m slow --modes all --write-matrix
"""

from __future__ import annotations

import pytest

from vllm_x86.tools.conformance.archs import BY_NAME


@pytest.fixture(scope="session")
def conformance_results(request):
    from tests.models.conftest import conformance_mode_archs, conformance_modes
    from vllm_x86.tools.conformance.matrix import default_results_path
    from vllm_x86.tools.conformance.suite import run_suite, select

    cfg = request.config
    names = [n for v in cfg.getoption("--arch") for n in v.split(",") if n]
    modes = conformance_modes(cfg)
    path = default_results_path()
    out = run_suite(
        select(names),
        modes,
        path,
        log=lambda s: print(s, flush=True),
        workers=cfg.getoption("--conformance-workers"),
        mode_archs=conformance_mode_archs(cfg),
    )
    if cfg.getoption("--write-matrix"):
        from vllm_x86.tools.conformance.matrix import write

        write(path)
    return out


# The first case also sets up the session fixture, which runs the whole suite (about 13
# minutes here on a quiet machine): pyproject's 900 s per test would cut it short on a
# slower one and turn every case into an error.
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_conformance(conformance_case, conformance_results):
    arch, mode = conformance_case
    entry = conformance_results[arch][mode]
    status, reason = entry["status"], entry["reason"]
    if status == "not run":
        pytest.skip(reason)
    if status == "xfail":
        pytest.xfail(f"{reason} (observed: {entry.get('observed', '')[:300]})")
    assert status == "pass", f"{arch} {mode}: {reason}\nmetrics: {entry['metrics']}"
    assert BY_NAME[arch]  # the case belongs to the table
