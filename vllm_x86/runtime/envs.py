"""Every VLLM_X86_* name the plugin reads or writes, in one table: name, default, meaning.

Settings are read when asked for (never cached at import), so tests and the CLI can
change them. CLI flags take precedence over these; vLLM's own settings (VLLM_CPU_*,
--gpu-memory-utilization, ...) given explicitly by the user always win over the
plugin's defaults.

Rows marked ``internal`` are not settings: the plugin writes them into the environment
of its own processes (a choice the first process of a tree made, so the engine and
worker processes it starts neither choose again nor report it as the user's), and a
user never sets them. docs/configuration.md lists the user-facing rows; a test
(tests/unit/test_settings_table.py) fails on a VLLM_X86_* name anywhere in the source
tree that is not in this table, and on a user-facing row the docs do not list.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str
    internal: bool = False  # written by the plugin for its own processes, never set by users


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "VLLM_X86_DISABLE",
        "0",
        "1: the platform plugin declines to load (register() returns None) and vLLM "
        "falls back to stock vLLM CPU. For side-by-side comparisons.",
    ),
    Setting(
        "VLLM_X86_CACHE_DIR",
        "~/.cache/vllm-x86",
        "Where pulled models (models/<name>) and other plugin caches live.",
    ),
    Setting(
        "VLLM_X86_THREADS",
        "auto",
        "Compute threads: 'auto' (the plugin's choice for this machine, see doctor) "
        "or a number (per rank with tensor or pipeline parallel). Ignored when VLLM_CPU_OMP_THREADS_BIND is set.",
    ),
    Setting(
        "VLLM_X86_KV_CACHE_GIB",
        "auto",
        "KV-cache size in GiB, per rank: 'auto' (the plugin's choice) or a number. Ignored when "
        "VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes or "
        "--gpu-memory-utilization is given.",
    ),
    Setting(
        "VLLM_X86_OPS",
        "1",
        "0: install none of the plugin's op overrides (ops/registry.py), so vLLM's own "
        "CPU ops run; platform defaults stay. For kernels-on/off comparisons.",
    ),
    Setting(
        "VLLM_X86_FP32_RESIDUAL",
        "1",
        "1: bf16/fp16 models keep the residual stream (the running sum of the residual "
        "connections) in float32, and the best logits are recomputed in float32 "
        "before sampling, which brings greedy output closer to the float32 model's "
        "(the default model's test prompts follow it wherever its two best tokens are "
        "at least 0.1 apart; docs/correctness.md); weights and GEMM inputs and outputs "
        "stay bf16. 0: round both to the model's dtype, as vLLM does.",
    ),
    Setting(
        "VLLM_X86_DIRECT_ATTENTION",
        "1",
        "vLLM's Attention layers on vLLM CPU's attention backend call its two attention "
        "kernels from one place (one op in a compiled graph) instead of through two "
        "Python custom ops per layer and step (same kernels, same arguments); 0: "
        "through vLLM's layer.",
    ),
    Setting(
        "VLLM_X86_DECODE_ATTENTION",
        "1",
        "1: with VLLM_X86_DIRECT_ATTENTION, decode steps (one new token per sequence) "
        "with little attention work write the KV cache and attend in one plugin kernel "
        "(torch.ops.vllm_x86.decode_attention, float32 inside; in vLLM's amx cache layout "
        "the probabilities rounded to bf16 as vLLM's AMX kernel rounds them, so its output "
        "is vLLM's bit for bit) instead of vLLM CPU's two kernels; larger ones, prefill and "
        "layers it does not take (ALiBi, sliding window, soft cap) keep vLLM's. 0: vLLM's "
        "kernels always.",
    ),
    Setting(
        "VLLM_X86_FUSED_DECODE_LAYER",
        "1",
        "1: decode steps of Llama, Qwen2, Qwen3 and Mistral decoder layers whose four "
        "linear layers run the "
        "plugin's INT8 or INT4 kernels call one C++ op per layer "
        "(torch.ops.vllm_x86.decode_layer: the norms, QKV, rotary, KV-cache write and "
        "attention, output projection, MLP, with the same kernels and results as the "
        "plugin's eager path) instead of about ten ops with Python between them; a "
        "compiled model whose layers all take it runs its decode steps so, outside the "
        "compiled graph. Prefill, long contexts and layers it does not take keep the "
        "layer's own code (compiled where the model is). 0: the layer's own code always.",
    ),
    Setting(
        "VLLM_X86_FUSED_VERIFICATION",
        "1",
        "1: with speculative decoding, steps of up to k + 2 new tokens per sequence (the "
        "verification of k drafted tokens, a draft model's first step of a round) take the "
        "fused decode call too, each token attending as a decode step of its own, where "
        "VLLM_X86_FUSED_DECODE_LAYER takes the layers. 0: such steps run the layers' own "
        "code, as prefill does.",
    ),
    Setting(
        "VLLM_X86_QUANT_GROUP_SIZE",
        "128",
        "x86_int4 quantizing a bf16 checkpoint while it loads: input channels per scale "
        "(32, 64 or 128; layers whose input size it does not divide use 64 or 32).",
    ),
    Setting(
        "VLLM_X86_QUANT_ZERO_POINT",
        "1",
        "x86_int4 quantizing while loading: 1 for asymmetric groups (a zero point per "
        "group; same kernel and speed, lower perplexity: docs/quantization.md), 0 for "
        "symmetric ones.",
    ),
    Setting(
        "VLLM_X86_QUANT_INT4_ROUNDING",
        "search",
        "x86_int4 quantizing while loading (and the LM head in INT4, and `vllm-x86 quantize "
        "--method rtn`, GPTQ's starting ranges): how each group's scale and zero point are "
        "chosen. search: the least |w|-weighted squared error among a few clipping ranges "
        "of the group's smaller side; minmax: the group's min and max (the earlier default).",
    ),
    Setting(
        "VLLM_X86_QUANT_INT4_GRID",
        "1",
        "x86_int4 quantizing while loading (and `vllm-x86 quantize`): 1 keeps a Linear "
        "weight's own 4-bit grid where it already has one (each group of 32 inputs on 16 "
        "evenly spaced values, as in a model dequantized from a GGUF Q4_0, Q4_1 or Q4_K "
        "file): that layer is stored in groups of 32 with zero points in eighths of a step, "
        "which reproduces it, instead of being rounded again onto groups of "
        "VLLM_X86_QUANT_GROUP_SIZE; 0: every layer in VLLM_X86_QUANT_GROUP_SIZE's groups.",
    ),
    Setting(
        "VLLM_X86_QUANT_LM_HEAD",
        "0",
        "x86_int8/x86_int4: 1 (or int8) runs the LM head in INT8 too, int4 in INT4 "
        "(x86_int4's groups and zero points), quantized while loading; 0 keeps it in the "
        "model's dtype. Embedding lookups stay in the model's dtype.",
    ),
    Setting(
        "VLLM_X86_QUANT_A8_ROWS",
        "4",
        "x86_int8/x86_int4 on AVX-512 VNNI without AMX: from this many rows (tokens in a "
        "step: prefill, or that many requests decoding) the GEMMs round activations to 8 "
        "bits with a scale per 64 inputs, one vpdpbusd per 4 inputs instead of two (1.4-1.8x "
        "faster GEMMs from 16 rows; +0.27 % perplexity for INT8 on the default model: "
        "docs/quantization.md); below it, and always on AMX, 16-bit activations. 0: never.",
    ),
    Setting(
        "VLLM_X86_QUANT_VNNI_ROWS",
        "2",
        "x86_int4 on a CPU with AMX and AVX-512 VNNI: INT4 GEMMs of at most this many rows "
        "(decode of one or two requests) run the VNNI kernel, which streams one row's "
        "weights 1.4-2.1x faster than the AMX tiles (same packed weights, same bits: "
        "docs/quantization.md); more rows run AMX. 0: AMX at every row count.",
    ),
    Setting(
        "VLLM_X86_QUANT_KERNEL",
        "auto",
        "x86_int8/x86_int4 kernels where the CPU has AMX or AVX-512 VNNI: auto (the "
        "plugin's int8_w8a16_gemm / int4_w4a16_gemm, 16-bit activations, AMX or VNNI code; "
        "INT4 groups of 32: vLLM CPU's kernel with AMX, PyTorch's without), vllm (models quantized while loading run vLLM CPU's AMX kernels, "
        "8-bit activations: less accurate) or torch (PyTorch's weight-only kernels; slow "
        "for batches). For comparisons.",
    ),
    Setting(
        "VLLM_X86_ENGINE_FORK",
        "1",
        "With VLLM_X86_SERVE_DEFAULTS=1 (`vllm-x86 serve`, the standby daemon) vLLM's "
        "engine-core and worker processes start by fork, so they inherit the server's "
        "imports instead of importing torch and vLLM again; 0: vLLM CPU's spawn. Other "
        "entry points (the LLM class, vLLM's own server module) always spawn, as vLLM "
        "CPU does whatever VLLM_WORKER_MULTIPROC_METHOD says.",
    ),
    Setting(
        "VLLM_X86_WORKER_IN_ENGINE",
        "auto",
        "With one worker, run it inside vLLM's engine-core process (vLLM's UniProcExecutor) "
        "instead of the separate worker process vLLM CPU always starts. auto: for servers "
        "started by `vllm-x86 serve` or its daemon (VLLM_X86_SERVE_DEFAULTS=1) whose "
        "engine processes are forked (VLLM_X86_ENGINE_FORK); 1: also with other entry "
        "points; 0: vLLM CPU's worker process.",
    ),
    Setting(
        "VLLM_X86_SLOT_MAPPING",
        "1",
        "Each step's KV-cache slot mapping by the plugin's code, a few small PyTorch "
        "operations on the calling thread, instead of vLLM CPU's C++ stand-in, which "
        "opens an OpenMP region and so waits for the model's other threads at the start "
        "of every step (tiny model, 2 vCPUs: 0.6 ms less per decode step). 0: vLLM CPU's.",
    ),
    Setting(
        "VLLM_X86_SAMPLER_ONE_THREAD",
        "1",
        "vLLM's sampler on the calling thread alone (OpenMP thread count 1) where the "
        "step's logits are small (up to 262,144 values: one request's row), so the float32 "
        "conversion and the greedy token open no OpenMP region that waits for the model's "
        "other threads. 0: PyTorch's threads.",
    ),
    Setting(
        "VLLM_X86_ENGINE_IN_SERVER",
        "0",
        "With VLLM_X86_SERVE_DEFAULTS=1 (`vllm-x86 serve`, the standby daemon), forked "
        "engine processes (VLLM_X86_ENGINE_FORK) and one worker inside the engine "
        "(VLLM_X86_WORKER_IN_ENGINE), run vLLM's engine core as a thread of the OpenAI "
        "server's process instead of a process of its own: one process and one Python "
        "heap fewer. 0: the engine core's own process, as in vLLM.",
    ),
    Setting(
        "VLLM_X86_USE_PREPACKED",
        "1",
        "`vllm-x86 serve MODEL --quantization x86_int8|x86_int4` (and the playground's "
        "INT8/INT4 switch) serves a prepacked checkpoint `vllm-x86 quantize` wrote for the "
        "same weights with the same settings, instead of quantizing again while loading; "
        "0 always quantizes while loading.",
    ),
    Setting(
        "VLLM_X86_CPP_WRAPPER",
        "0",
        "1: in compiled mode Inductor writes the model's wrapper code in C++ "
        "(inductor_compile_config cpp_wrapper) instead of Python, taking the Python "
        "between the compiled kernels out of each decode step. It needs vLLM's layer "
        "names as plain strings (VLLM_USE_LAYERNAME=0) from before vLLM is imported: "
        "`vllm-x86 serve`, `pull` and the daemon set that; elsewhere set both yourself. "
        "Its compile takes several times longer.",
    ),
    Setting(
        "VLLM_X86_KV_ZERO_PAGES",
        "1",
        "The worker allocates vLLM's KV cache from fresh zero pages of an anonymous "
        "mapping (zero by definition, faulted in as the cache fills) instead of writing "
        "zeros over all of it at start-up (kv_alloc.py); 0: vLLM's torch.zeros.",
    ),
    Setting(
        "VLLM_X86_MALLOC_TRIM",
        "1",
        "After warm-up the engine gives the heap pages that loading and warming up "
        "freed back to the system (glibc's malloc_trim; heap.py): about 100 MiB less "
        "resident memory for a small model quantized while loading; the API server does "
        "the same after its tokenizer copies (about 110 MiB for Qwen2.5's tokenizer). "
        "0: they stay with the processes, for reuse.",
    ),
    Setting(
        "VLLM_X86_FILE_EMBEDDING",
        "1",
        "An input embedding whose table nothing computes with (an untied or INT8/INT4 LM "
        "head) is read by row from the checkpoint's safetensors file instead of held in "
        "the engine's memory (ops/file_embedding.py): 272 MB less for Qwen2.5-Coder-0.5B; "
        "and vLLM CPU's oneDNN copy of an input embedding is dropped where the model has "
        "its own LM head (as much again). 0: both as vLLM holds them.",
    ),
    Setting(
        "VLLM_X86_FRONTEND_WARMUP",
        "1",
        "With VLLM_X86_SERVE_DEFAULTS=1 (`vllm-x86 serve`, the daemon's servers) the "
        "OpenAI server makes its tokenizer copies and looks up the model's processor chat "
        "template while the engine process loads the model, instead of before starting "
        "it (runtime/patches/frontend_warmup.py); 0: vLLM's order.",
    ),
    Setting(
        "VLLM_X86_SHORT_WARMUP",
        "1",
        "Compiled mode: when vLLM's compiled model for this configuration is in its "
        "cache (it will load it, not compile), the worker warms up with a 16-token run "
        "instead of vLLM's profile run at the maximum batch (worker.py); 0: vLLM's.",
    ),
    Setting(
        "VLLM_X86_STAGED_WARMUP",
        "auto",
        "Compiled mode: when vLLM's compiled model for this configuration is not in its "
        "cache yet, the worker serves eagerly at once and compiles in a background "
        "process (nice 19), then switches to the compiled model (staged.py). auto: where "
        "VLLM_X86_SERVE_DEFAULTS=1 (servers started by `vllm-x86 serve` or its daemon); "
        "1: also elsewhere (vLLM's own server, the LLM class); 0: compile before "
        "serving, as vLLM does.",
    ),
    Setting(
        "VLLM_X86_ASYNC_SCHEDULING",
        "0",
        "1: keep vLLM's asynchronous scheduling (the engine schedules step N+1 while "
        "the worker runs step N), which vLLM CPU switches off; only where vLLM itself "
        "would use it (not for pooling models or unsupported speculative decoding). "
        "0: vLLM CPU's synchronous steps.",
    ),
    Setting(
        "VLLM_X86_SPECULATIVE",
        "off",
        "`vllm-x86 serve` without --speculative: 'ngram' turns on vLLM's n-gram "
        "(prompt-lookup) speculative decoding with the plugin's CPU defaults "
        "(tools/cli/speculative.py), 'draft:MODEL' drafts with a smaller model of the "
        "same tokenizer (a catalog name, directory or cached hub id), quantized as the "
        "served model, 'off' leaves it off. The flag wins over it, and vLLM's own "
        "--speculative-config wins over both.",
    ),
    Setting(
        "VLLM_X86_DAEMON_DIR",
        "<VLLM_X86_CACHE_DIR>/daemon",
        "Where the standby daemon keeps its control socket (daemon.sock), pid file, state "
        "file and logs (`vllm-x86 daemon`), owner-only (directory 0700, files 0600; "
        "refused when another user owns it). One daemon per directory.",
    ),
    Setting(
        "VLLM_X86_DAEMON_PORT",
        "0",
        "TCP port of the standby daemon's optional TCP control API (`vllm-x86 daemon start "
        "--port`, on --host or 127.0.0.1), which needs a key (--api-key or VLLM_API_KEY); "
        "0: no TCP, the owner-only Unix socket only (with --host: a free port).",
    ),
    Setting(
        "VLLM_X86_DAEMON_KEEP_ALIVE",
        "0",
        "Seconds the standby daemon keeps a model server loaded after the `vllm-x86 serve` "
        "attached to it leaves (Ctrl-C, SIGTERM), as Ollama keeps a model: it still "
        "answers on its port, and a `vllm-x86 serve` of the same model and flags attaches "
        "to it at once instead of starting it again. 0: the model server stops with its "
        "serve. Read by the daemon when it starts (`vllm-x86 daemon start --keep-alive S`).",
    ),
    Setting(
        "VLLM_X86_ISA",
        "auto",
        "Which build of the plugin's kernels runs: auto (the best this CPU has), "
        "avx2, avx512 or avx512_bf16. For testing and comparisons.",
    ),
    Setting(
        "VLLM_X86_SERVE_DEFAULTS",
        "0",
        "1: this process is a server whose engine starts before any other PyTorch work "
        "runs in it, and gets the plugin's server defaults: engine-core and worker "
        "processes forked (VLLM_X86_ENGINE_FORK), staged warm-up (VLLM_X86_STAGED_WARMUP=auto "
        "means on) and the tokenizer work beside the engine start "
        "(VLLM_X86_FRONTEND_WARMUP). `vllm-x86 serve` and the daemon set it to 1 for the "
        "servers they start unless it is set; 0 there gives those servers vLLM's own "
        "behaviour. Set it yourself only for a server that has run no PyTorch computation "
        "before vLLM starts its engine: a forked engine would inherit an OpenMP runtime "
        "whose threads it does not have, and hang.",
    ),
    Setting(
        "VLLM_X86_SKIP_KERNELS",
        "0",
        "Build time: 1 makes `pip install` of the plugin build no C++ kernels (setup.py); "
        "the plugin then runs without them (each op falls back to its PyTorch reference "
        "and says so once).",
    ),
    Setting(
        "VLLM_X86_CONFORMANCE_COMMAND",
        "pytest tests/models/test_conformance.py",
        "The command the conformance suite records for a run in "
        "docs/supported_models.json when it runs under pytest.",
    ),
    Setting(
        "VLLM_X86_JSON_BUDGET",
        "1",
        "JSON-schema requests (response_format json_schema, structured_outputs.json) "
        "always end as valid JSON: near max_tokens the grammar mask keeps only tokens "
        "after which the answer still closes in time, and a max_tokens too small for "
        "any valid instance is a 400 naming the smallest that works "
        "(docs/structured_output.md); 0: vLLM's own behaviour (the answer is cut at "
        "max_tokens).",
    ),
    Setting(
        "VLLM_X86_STEP_PROFILE",
        "",
        "A directory: the server's processes time the parts of each engine step (API "
        "server output processing, scheduler, worker round trip, input preparation, "
        "forward, LM head, sampling) and write them there, and the worker profiles its "
        "forward's ops on request (runtime/patches/step_profile.py; the harness's "
        "profiling mode, docs/overhead.md, sets it). Empty: off, nothing patched.",
    ),
    # Internal: written by the plugin into its own processes' environment.
    Setting(
        "VLLM_X86_CHOSEN",
        "",
        "The defaults this process tree's first process chose (comma-separated: active, "
        "threads, omp, fork, spawn, layout-TPxPP), so the processes it starts neither choose nor log "
        "them again (platform.py).",
        internal=True,
    ),
    Setting(
        "VLLM_X86_KV_BYTES_CHOSEN",
        "",
        "The KV-cache size in bytes the plugin chose, so a child process does not report "
        "it as the user's --kv-cache-memory-bytes (platform.py).",
        internal=True,
    ),
    Setting(
        "VLLM_X86_OMP_CHOSEN",
        "",
        "The OpenMP settings the plugin added to the environment (defaults.apply_omp_env, "
        "e.g. GOMP_SPINCOUNT=10000), so the platform's log can say the plugin chose them.",
        internal=True,
    ),
    Setting(
        "VLLM_X86_COMPILE_CACHE_CHECKED",
        "",
        "The compile-cache directory this process tree already checked against its "
        "manifests (startup/compile_cache.py).",
        internal=True,
    ),
    Setting(
        "VLLM_X86_COMPILE_CACHE_CHECKED_AT",
        "",
        "When that check ran (time.time()): artifacts written since are this start's own "
        "and are sealed anew (startup/compile_cache.py).",
        internal=True,
    ),
)

_BY_NAME = {s.name: s for s in SETTINGS}


def get(name: str) -> str:
    s = _BY_NAME[name]
    value = os.environ.get(name, "")
    return value if value != "" else s.default


def get_bool(name: str) -> bool:
    return get(name).strip().lower() in ("1", "true", "yes", "on")


def disabled() -> bool:
    return get_bool("VLLM_X86_DISABLE")


def serve_defaults() -> bool:
    """VLLM_X86_SERVE_DEFAULTS: this process is the plugin's own server (see the table)."""
    return get_bool("VLLM_X86_SERVE_DEFAULTS")


def cache_dir() -> str:
    return os.path.expanduser(get("VLLM_X86_CACHE_DIR"))


def daemon_dir() -> str:
    value = os.environ.get("VLLM_X86_DAEMON_DIR", "")
    return os.path.expanduser(value) if value else os.path.join(cache_dir(), "daemon")
