"""The contenders `vllm-x86 bench` can measure, each with its exact environment.

A contender's process gets the harness's environment with every ``VLLM_X86_*`` and
``VLLM_CPU_*`` setting removed (so a developer's shell does not change what is
measured; ``VLLM_X86_CACHE_DIR`` stays: it says where models are, not how they run),
plus the contender's own ``env``. The plugin's servers also get
``VLLM_X86_STAGED_WARMUP=0``: in compiled mode they compile before serving, so what is
measured is the compiled model (staged.py).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field, replace


class BenchError(Exception):
    """A benchmark cannot run as asked; the message is meant for the user."""


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "plugin-server": `vllm-x86 serve`; "vllm-server": vLLM's own server; "llamacpp"
    description: str
    env: dict[str, str] = field(default_factory=dict)
    # extra server flags (e.g. --quantization x86_int8)
    args: tuple[str, ...] = ()
    # "eager" or "compiled" for this contender only (`NAME@eager`); None: the run's --mode
    mode: str | None = None

    @property
    def quantization(self) -> str | None:
        a = self.args
        return a[a.index("--quantization") + 1] if "--quantization" in a else None

    @property
    def is_server(self) -> bool:
        return self.kind in ("plugin-server", "vllm-server")


# The smallest change stock vLLM CPU needs to start on the development machines: without
# it, it sizes its KV cache from a NUMA node's meminfo and stops with "Available memory
# on node 0 (...) is less than desired CPU memory utilization" (measured-baseline.md).
STOCK_START_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}

LLAMACPP_INSTALL = (
    'CMAKE_ARGS="-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" '
    ".venv/bin/pip install llama-cpp-python==0.3.36"
)
# On a CPU with AMX llama.cpp's native build (-march=native) compiles its AMX code
# whatever GGML_AMX_* say, and this machine's GCC 12 miscompiles it (a crash at the first
# decode): build for AVX-512 explicitly there (docs/benchmarks.md).
LLAMACPP_INSTALL_AMX = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON '
    "-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
    '-DGGML_AVX512_VBMI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" '
    ".venv/bin/pip install llama-cpp-python==0.3.36"
)


def llamacpp_install() -> str:
    """The install command that builds a working llama.cpp on this CPU."""
    from vllm_x86.runtime import hardware

    return LLAMACPP_INSTALL_AMX if hardware.cpu_info().has("amx_tile") else LLAMACPP_INSTALL


CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in (
        Contender(
            "plugin",
            "plugin-server",
            "vllm-x86 with its defaults: `vllm-x86 serve MODEL`",
        ),
        Contender(
            "stock",
            "vllm-server",
            "stock vLLM CPU in the same venv: `python -m vllm.entrypoints.openai.api_server "
            "--model MODEL` with VLLM_X86_DISABLE=1, plus the one change it needs to start "
            "here: VLLM_CPU_KVCACHE_SPACE=1 (a 1 GiB KV cache)",
            {"VLLM_X86_DISABLE": "1", **STOCK_START_ENV},
        ),
        Contender(
            "plugin-1thread",
            "plugin-server",
            "vllm-x86 with vLLM's thread layout for 2 cores (VLLM_CPU_OMP_THREADS_BIND=0): "
            "1 model thread, the other core left to the engine loop",
            {"VLLM_CPU_OMP_THREADS_BIND": "0"},
        ),
        Contender(
            "plugin-spawn",
            "plugin-server",
            "vllm-x86 starting its engine processes by spawn, as vLLM CPU does "
            "(VLLM_X86_ENGINE_FORK=0), instead of by fork",
            {"VLLM_X86_ENGINE_FORK": "0"},
        ),
        Contender(
            "plugin-worker-process",
            "plugin-server",
            "vllm-x86 with the worker in a process of its own, as vLLM CPU starts it "
            "(VLLM_X86_WORKER_IN_ENGINE=0), instead of inside the engine-core process",
            {"VLLM_X86_WORKER_IN_ENGINE": "0"},
        ),
        Contender(
            "plugin-async",
            "plugin-server",
            "vllm-x86 with vLLM's asynchronous scheduling kept (VLLM_X86_ASYNC_SCHEDULING=1): "
            "the engine schedules the next step while the worker runs this one",
            {"VLLM_X86_ASYNC_SCHEDULING": "1"},
        ),
        Contender(
            "plugin-noops",
            "plugin-server",
            "vllm-x86 with its op table switched off (VLLM_X86_OPS=0): vLLM's own CPU ops, "
            "the plugin's platform defaults (threads, KV cache size)",
            {"VLLM_X86_OPS": "0"},
        ),
        Contender(
            "plugin-customops",
            "plugin-server",
            "vllm-x86 with every CustomOp on in compiled mode (`--compilation-config "
            '\'{"custom_ops": ["all"]}\'`): the plugin\'s RMSNorm, rotary and fused '
            "Qwen3 attention ops run inside the compiled graph instead of Inductor's code",
            args=("--compilation-config", '{"custom_ops": ["all"]}'),
        ),
        Contender(
            "plugin-int8",
            "plugin-server",
            "vllm-x86 quantizing the checkpoint to INT8 while it loads (`--quantization x86_int8`)",
            args=("--quantization", "x86_int8"),
        ),
        Contender(
            "plugin-int4",
            "plugin-server",
            "vllm-x86 quantizing the checkpoint to INT4 while it loads (groups of 128, or of 32 "
            "where the weights already sit on a 4-bit grid; `--quantization x86_int4`)",
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int8-wo",
            "plugin-server",
            "vllm-x86 quantizing to INT8 while it loads, run by PyTorch's weight-only kernels "
            "(`--quantization x86_int8`, VLLM_X86_QUANT_KERNEL=torch): what a CPU without "
            "the plugin's INT8/INT4 kernels gets",
            {"VLLM_X86_QUANT_KERNEL": "torch"},
            args=("--quantization", "x86_int8"),
        ),
        Contender(
            "plugin-int4-wo",
            "plugin-server",
            "vllm-x86 quantizing to INT4 (group 128) while it loads, run by PyTorch's "
            "weight-only kernels (`--quantization x86_int4`, VLLM_X86_QUANT_KERNEL=torch)",
            {"VLLM_X86_QUANT_KERNEL": "torch"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int8-head",
            "plugin-server",
            "vllm-x86 quantizing to INT8 while it loads, the LM head too "
            "(`--quantization x86_int8`, VLLM_X86_QUANT_LM_HEAD=1)",
            {"VLLM_X86_QUANT_LM_HEAD": "1"},
            args=("--quantization", "x86_int8"),
        ),
        Contender(
            "plugin-int4-head",
            "plugin-server",
            "vllm-x86 quantizing to INT4 (group 128) while it loads, the LM head to INT8 "
            "(`--quantization x86_int4`, VLLM_X86_QUANT_LM_HEAD=1)",
            {"VLLM_X86_QUANT_LM_HEAD": "1"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int4-head4",
            "plugin-server",
            "vllm-x86 quantizing to INT4 (group 128) while it loads, the LM head to INT4 "
            "too (`--quantization x86_int4`, VLLM_X86_QUANT_LM_HEAD=int4)",
            {"VLLM_X86_QUANT_LM_HEAD": "int4"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int8-head-vllm-slots",
            "plugin-server",
            "plugin-int8-head with vLLM CPU's C++ slot mapping (an OpenMP region at the "
            "start of every step) instead of the plugin's (VLLM_X86_SLOT_MAPPING=0)",
            {"VLLM_X86_QUANT_LM_HEAD": "1", "VLLM_X86_SLOT_MAPPING": "0"},
            args=("--quantization", "x86_int8"),
        ),
        Contender(
            "plugin-int8-head-sampler-threads",
            "plugin-server",
            "plugin-int8-head with vLLM's sampler on PyTorch's threads for every step, one "
            "request's logits too (VLLM_X86_SAMPLER_ONE_THREAD=0)",
            {"VLLM_X86_QUANT_LM_HEAD": "1", "VLLM_X86_SAMPLER_ONE_THREAD": "0"},
            args=("--quantization", "x86_int8"),
        ),
        Contender(
            "plugin-int4-head4-engine-thread",
            "plugin-server",
            "plugin-int4-head4 with vLLM's engine core as a thread of the OpenAI server's "
            "process instead of a process of its own (VLLM_X86_ENGINE_IN_SERVER=1)",
            {"VLLM_X86_QUANT_LM_HEAD": "int4", "VLLM_X86_ENGINE_IN_SERVER": "1"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int4-head-engine-thread",
            "plugin-server",
            "plugin-int4-head with vLLM's engine core as a thread of the OpenAI server's "
            "process instead of a process of its own (VLLM_X86_ENGINE_IN_SERVER=1)",
            {"VLLM_X86_QUANT_LM_HEAD": "1", "VLLM_X86_ENGINE_IN_SERVER": "1"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int4-head-layer-ops",
            "plugin-server",
            "plugin-int4-head with each decoder layer's decode step as its ten op calls "
            "instead of one fused call (VLLM_X86_FUSED_DECODE_LAYER=0)",
            {"VLLM_X86_QUANT_LM_HEAD": "1", "VLLM_X86_FUSED_DECODE_LAYER": "0"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int4-head4-layer-ops",
            "plugin-server",
            "plugin-int4-head4 with each decoder layer's decode step as its ten op calls "
            "instead of one fused call (VLLM_X86_FUSED_DECODE_LAYER=0)",
            {"VLLM_X86_QUANT_LM_HEAD": "int4", "VLLM_X86_FUSED_DECODE_LAYER": "0"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int8-head-layer-ops",
            "plugin-server",
            "plugin-int8-head with each decoder layer's decode step as its ten op calls "
            "instead of one fused call (VLLM_X86_FUSED_DECODE_LAYER=0)",
            {"VLLM_X86_QUANT_LM_HEAD": "1", "VLLM_X86_FUSED_DECODE_LAYER": "0"},
            args=("--quantization", "x86_int8"),
        ),
        Contender(
            "plugin-int4-head-embed-mem",
            "plugin-server",
            "plugin-int4-head with the input embedding held in memory as vLLM holds it, "
            "and vLLM CPU's oneDNN copy of it (VLLM_X86_FILE_EMBEDDING=0)",
            {"VLLM_X86_QUANT_LM_HEAD": "1", "VLLM_X86_FILE_EMBEDDING": "0"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int4-head4-embed-mem",
            "plugin-server",
            "plugin-int4-head4 with the input embedding held in memory as vLLM holds it, "
            "and vLLM CPU's oneDNN copy of it (VLLM_X86_FILE_EMBEDDING=0)",
            {"VLLM_X86_QUANT_LM_HEAD": "int4", "VLLM_X86_FILE_EMBEDDING": "0"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int4-head4-regroup",
            "plugin-server",
            "plugin-int4-head4 with every Linear layer rounded again into groups of 128 "
            "(VLLM_X86_QUANT_INT4_GRID=0), even where the weights already sit on a 4-bit "
            "grid of 32",
            {"VLLM_X86_QUANT_LM_HEAD": "int4", "VLLM_X86_QUANT_INT4_GRID": "0"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-spin",
            "plugin-server",
            "vllm-x86 with libgomp's default spinning (GOMP_SPINCOUNT=300000; the plugin "
            "sets 10000 where every core runs a model thread, docs/threads.md)",
            {"GOMP_SPINCOUNT": "300000"},
        ),
        Contender(
            "plugin-vllm-decode-attention",
            "plugin-server",
            "vllm-x86 with vLLM CPU's two attention kernels in decode steps instead of the "
            "plugin's one (VLLM_X86_DECODE_ATTENTION=0; kernels.md)",
            {"VLLM_X86_DECODE_ATTENTION": "0"},
        ),
        Contender(
            "plugin-int4-head-spin",
            "plugin-server",
            "plugin-int4-head with libgomp's default spinning (GOMP_SPINCOUNT=300000)",
            {"VLLM_X86_QUANT_LM_HEAD": "1", "GOMP_SPINCOUNT": "300000"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-int8-a16",
            "plugin-server",
            "vllm-x86 quantizing to INT8 while it loads, 16-bit activations at every batch "
            "size (`--quantization x86_int8`, VLLM_X86_QUANT_A8_ROWS=0; on AVX-512 VNNI the "
            "default takes 8-bit ones from 4 rows)",
            {"VLLM_X86_QUANT_A8_ROWS": "0"},
            args=("--quantization", "x86_int8"),
        ),
        Contender(
            "plugin-int4-a16",
            "plugin-server",
            "vllm-x86 quantizing to INT4 while it loads (as plugin-int4), 16-bit activations "
            "at every batch size (`--quantization x86_int4`, VLLM_X86_QUANT_A8_ROWS=0)",
            {"VLLM_X86_QUANT_A8_ROWS": "0"},
            args=("--quantization", "x86_int4"),
        ),
        Contender(
            "plugin-tp2",
            "plugin-server",
            "vllm-x86 with two tensor-parallel ranks (`--tensor-parallel-size 2`): each "
            "rank on its own cores, vLLM's CPU communicator between them",
            args=("--tensor-parallel-size", "2"),
        ),
        Contender(
            "plugin-pp2",
            "plugin-server",
            "vllm-x86 with two pipeline-parallel ranks (`--pipeline-parallel-size 2`): each "
            "rank on its own cores with half of the layers",
            args=("--pipeline-parallel-size", "2"),
        ),
        Contender(
            "llamacpp",
            "llamacpp",
            "llama.cpp through llama-cpp-python (Llama API in a fresh process, one thread per "
            "CPU), on the same weights as a GGUF file",
        ),
    )
}

BASELINE = "stock"


def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def parse_contenders(spec: str) -> list[Contender]:
    """'stock,plugin' -> contenders, in order. 'auto': stock, plugin, and llamacpp when
    llama-cpp-python is installed. `NAME@eager` / `NAME@compiled` runs one contender in
    that mode whatever --mode says (`plugin@eager,stock@compiled`). Raises BenchError for
    anything it cannot run."""
    spec = spec.strip()
    if spec == "auto":
        names = ["stock", "plugin"] + (["llamacpp"] if llamacpp_available() else [])
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise BenchError("no contenders given (--contenders stock,plugin)")
    modes = {}
    for n in names:
        base, _, m = n.partition("@")
        if m and m not in ("eager", "compiled"):
            raise BenchError(f"'{n}': the mode after '@' must be eager or compiled")
        if m and CONTENDERS.get(base) is not None and not CONTENDERS[base].is_server:
            raise BenchError(f"'{n}': only vLLM server contenders have an eager/compiled mode")
        modes[n] = (base, m or None)
    unknown = [n for n in names if modes[n][0] not in CONTENDERS]
    if unknown:
        raise BenchError(
            f"unknown contender(s): {', '.join(unknown)}. Known: {', '.join(CONTENDERS)} "
            "(or 'auto')"
        )
    if len(set(names)) != len(names):
        raise BenchError(f"a contender is named twice in '{spec}'")
    if any(modes[n][0] == "llamacpp" for n in names) and not llamacpp_available():
        raise BenchError(
            "the llamacpp contender needs llama-cpp-python, which is not installed. It "
            f"builds llama.cpp from source (about 4 minutes): {llamacpp_install()}"
        )
    out = []
    for n in names:
        base, m = modes[n]
        c = CONTENDERS[base]
        flag = "--enforce-eager" if m == "eager" else "vLLM's compiled mode"
        out.append(
            c if m is None else replace(c, name=n, mode=m, description=f"{c.description}; {flag}")
        )
    return out


def contender_env(contender: Contender, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a contender's process runs with (see the module docstring)."""
    base = dict(os.environ if base is None else base)
    env = {
        k: v
        for k, v in base.items()
        if k == "VLLM_X86_CACHE_DIR" or not k.startswith(("VLLM_X86_", "VLLM_CPU_"))
    }
    if contender.kind == "plugin-server":
        # Compiled from its first measured token: no staged warm-up (serving eagerly
        # while it compiles, staged.py) inside a measurement.
        env["VLLM_X86_STAGED_WARMUP"] = "0"
    env.update(contender.env)
    return env
