"""THE table of architectures the conformance suite checks.

One row per text-generation architecture class that vLLM 0.32 implements natively and
transformers 5.19 also has: the reference implementation exists, so parity can be
checked. Each row gives real model ids that use the architecture (for the support
matrix), the features the tiny checkpoint keeps, and the config arguments that differ
from the generic shrink in ``tiny.py``.

``known`` maps a mode ("fp32-eager", "bf16-eager", "fp32-compiled", "bf16-compiled",
"int8-eager", "int4-eager", or "*" for all) to the reason the architecture does not
pass there: a missing capability named precisely. The suite marks those cases xfail
(strict: a case that starts passing fails the suite until its row is updated) and the
matrix prints the reason. The quantized modes of an architecture that fails bf16 eager
are not run (``not_run_reason``): bf16's reason stands for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arch:
    name: str  # the class name in config.json's "architectures"
    examples: tuple[str, ...]
    features: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # mode -> why it fails (an xfail; a pass then fails the suite until this is updated).
    # "MODE@amx" / "MODE@no-amx" holds only on CPUs with / without AMX: bf16 rounding,
    # and with it a MoE routing near tie, differs between the two GEMM paths.
    known: dict[str, str] = field(default_factory=dict)
    family: str = ""
    gain: float = 4.0  # tiny.LAYER_GAIN unless the embedding needs larger layers beside it
    skip: str = ""  # why the suite does not run it at all (a limit of the suite itself)
    engine: dict[str, Any] = field(default_factory=dict)  # extra vLLM engine arguments
    # a rewrite in formats.py giving the tiny checkpoint the format of the real ones on
    # the Hub, where transformers saves another one that vLLM does not read
    hub_format: str = ""


# MLA on vLLM CPU: the attention kernels are built for a latent cache of
# kv_lora_rank 512 + rope 64 only (cpu_mla.py / amx_mla.py get_supported_head_sizes).
MLA = {
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "head_dim": 64,
    "num_key_value_heads": 4,
}

_BLOOM_GELU = "vLLM's Bloom MLP runs the exact erf GELU (vllm/model_executor/models/bloom.py:165, get_act_fn('gelu')) where transformers runs BLOOM's tanh approximation (transformers/models/bloom/modeling_bloom.py:111, bloom_gelu_forward): tokens equal, prompt log-probs 2.7e-3 apart (tolerance 2e-3); with transformers switched to erf GELU they agree to 2.1e-5, so ALiBi attention and every CPU op agree. A difference of vLLM's model file, not of an op"

ARCHS: tuple[Arch, ...] = (
    # --- Llama and close relatives
    Arch(
        "LlamaForCausalLM",
        ("meta-llama/Llama-3.1-8B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        "GQA, RMSNorm, SwiGLU, llama3 rope scaling",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
        family="Llama",
    ),
    Arch(
        "MistralForCausalLM",
        ("mistralai/Mistral-7B-Instruct-v0.3",),
        "GQA, sliding window",
        family="Mistral",
    ),
    Arch(
        "Ministral3ForCausalLM",
        ("mistralai/Ministral-3-8B-Instruct-2512",),
        "GQA, YaRN rope with llama-4 attention scaling",
        family="Mistral",
    ),
    Arch(
        "MixtralForCausalLM",
        ("mistralai/Mixtral-8x7B-Instruct-v0.1",),
        "MoE 8 experts top-2, GQA",
        family="Mixtral",
    ),
    Arch(
        "ApertusForCausalLM",
        ("swiss-ai/Apertus-8B-Instruct-2509",),
        "xIELU activation, q/k norms",
    ),
    Arch(
        "HyperCLOVAXForCausalLM",
        ("naver-hyperclovax/HyperCLOVAX-SEED-Think-14B",),
        "muP multipliers, post-norms",
    ),
    Arch(
        "Llama4ForCausalLM",
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct",),
        "MoE top-1 with shared expert (router weight on the input), chunked attention, "
        "NoPE layers, q/k L2 norm",
        {"num_experts_per_tok": 1, "num_hidden_layers": 4, "attention_chunk_size": 32},
        # vLLM needs the chunk to be a multiple of the KV block; the CPU backend's
        # smallest block is 32, so the 40-token sequence spans two chunks
        engine={"block_size": 32},
    ),
    # --- Qwen
    Arch(
        "Qwen2ForCausalLM",
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct"),
        "GQA, q/k/v biases",
        {"tie_word_embeddings": True},
        family="Qwen2/2.5",
    ),
    Arch(
        "Qwen2MoeForCausalLM",
        ("Qwen/Qwen1.5-MoE-A2.7B-Chat",),
        "MoE with gated shared expert, q/k/v biases",
        family="Qwen2/2.5",
        gain=8.0,
    ),
    Arch(
        "Qwen3ForCausalLM",
        ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"),
        "GQA, q/k RMSNorm",
        family="Qwen3",
    ),
    Arch(
        "Qwen3MoeForCausalLM",
        ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B"),
        "MoE 8 experts top-2, q/k RMSNorm",
        {"norm_topk_prob": True},
        family="Qwen3-MoE",
    ),
    Arch(
        "Qwen3NextForCausalLM",
        ("Qwen/Qwen3-Next-80B-A3B-Instruct",),
        "hybrid Gated DeltaNet + gated full attention, MoE with shared expert, partial rotary",
        {
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "num_hidden_layers": 4,
        },
        family="Qwen3-Next",
    ),
    Arch(
        "Qwen3_5ForCausalLM",
        ("Qwen/Qwen3.5-9B",),
        "hybrid Gated DeltaNet + gated full attention, partial rotary",
        {
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "num_hidden_layers": 4,
        },
        family="Qwen3.5",
    ),
    Arch(
        "Qwen3_5MoeForCausalLM",
        ("Qwen/Qwen3.5-35B-A3B",),
        "hybrid Gated DeltaNet + full attention, MoE with shared expert",
        {
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "num_hidden_layers": 4,
        },
        family="Qwen3.5",
        known={
            "int8-eager": "MoE routing near tie, not the kernels (`python -m vllm_x86.tools.conformance.routing Qwen3_5MoeForCausalLM x86_int8 1`): the same weights are quantized on both sides; at prompt position 2 the fake-quantized fp32 reference ranks layer 0's 2nd and 3rd experts 0.0015 apart, less than the 0.008 by which vLLM's bf16 router inputs move the logits, and vLLM routes to the other expert; later layers attend to that position and more choices differ. Given vLLM's router inputs where the choices differ (layer 0: 1 position, layers 1-3: 2, 4 and 6), the reference gives vLLM's greedy token 1 (454; 509 without, 454 6.0 below it) and log-probs within 0.35 of vLLM's (3.21 without; tolerance 1.85)",
        },
    ),
    Arch(
        "Qwen4ExpForCausalLM",
        ("Qwen/Qwen4-Exp",),
        "hybrid linear attention, MoE, hyper-connections, n-gram embeddings",
        {
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "num_hidden_layers": 4,
            "indexer_n_heads": 2,
            "indexer_kv_heads": 1,
            "indexer_head_dim": 32,
            "indexer_budget": 16,
            "indexer_compress_ratio": 4,
            "hc_lowrank": 16,
            # transformers saves null (meaning hidden_act, silu); vLLM reads the field
            # with getattr(config, "output_gate_type", "silu") and rejects None
            # (qwen_gdn_linear_attn.py:565)
            "output_gate_type": "silu",
        },
        known={
            "fp32-eager": "vLLM's Qwen4-Exp QSA (indexed sparse attention, every non-linear layer) is bf16 only: models/qwen4_exp/nvidia/indexer_qsa.py:112 raises 'Qwen4Exp QSA currently requires BF16'",
            "bf16-eager": "vLLM's Qwen4-Exp QSA attention runs on FlashAttention only (models/qwen4_exp/nvidia/qsa.py:253: 'Qwen4Exp QSA requires FlashAttention'), which vLLM CPU does not have; a CPU QSA (indexer + sparse paged attention) is a new attention backend, not an op",
            "fp32-compiled": "as fp32-eager: Qwen4-Exp QSA is bf16 only (indexer_qsa.py:112)",
            "bf16-compiled": "as bf16-eager: Qwen4-Exp QSA needs FlashAttention (qsa.py:253)",
        },
    ),
    # --- DeepSeek and MLA
    Arch(
        "DeepseekV2ForCausalLM",
        (
            "deepseek-ai/DeepSeek-V2-Lite-Chat",
            "deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct",
        ),
        "MLA (kv_lora 512, rope 64), MoE with shared experts, first layer dense",
        {
            "n_group": 1,
            "topk_group": 1,
            **MLA,
            "q_lora_rank": None,
            "num_experts_per_tok": 2,
            "topk_method": "greedy",
        },
        family="DeepSeek-V2/V3",
    ),
    Arch(
        "DeepseekV3ForCausalLM",
        ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1"),
        "MLA with q LoRA, sigmoid group-limited routing with bias, shared expert",
        {
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            **MLA,
            "n_group": 2,
            "topk_group": 1,
        },
        family="DeepSeek-V2/V3",
    ),
    Arch(
        "DeepseekV32ForCausalLM",
        ("deepseek-ai/DeepSeek-V3.2-Exp",),
        "MLA + DeepSeek sparse attention indexer, MoE",
        {
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            **MLA,
            "index_head_dim": 128,
            "n_group": 2,
            "topk_group": 1,
        },
        family="DeepSeek-V2/V3",
        known={
            "*": "DeepSeek sparse attention (the indexer) has no CPU backend in vLLM 0.32 (NotImplementedError: Sparse Attention is not supported on CPU)"
        },
    ),
    Arch(
        "DeepseekV4ForCausalLM",
        ("deepseek-ai/DeepSeek-V4-Flash",),
        "compressed sparse attention, hyper-connections, MoE",
        # vLLM's DeepSeek-V4 caches are laid out for its real head sizes only
        # (compressor.py: attention 512, indexer 128); its o-projection groups split
        # the heads (cpu_sparse.py), so fewer groups than heads; 4 layers give
        # hash-routed and score-routed MoE layers, HCA and CSA attention
        {
            "o_lora_rank": 32,
            "o_groups": 2,
            "head_dim": 512,
            "index_head_dim": 128,
            "num_hidden_layers": 4,
        },
        hub_format="deepseek_v4",
        known={
            "*": "with the Hub's layout (formats.deepseek_v4) vLLM's CPU DeepSeek-V4 model builds and loads, then its first step stops in the sparse-SWA attention metadata builder (v1/attention/backends/mla/sparse_swa.py:610): compute_token_to_req_indices (v1/attention/ops/metadata.py:43) is a Triton kernel and Triton has no CPU backend here (TypeError: 'function' object is not subscriptable); the plugin's op table has no row kind for replacing such a function yet"
        },
    ),
    Arch(
        "KimiLinearForCausalLM",
        ("moonshotai/Kimi-Linear-48B-A3B-Instruct",),
        "hybrid Kimi delta attention + MLA, MoE",
        {
            "linear_head_dim": 128,
            **MLA,
            "num_hidden_layers": 4,
            "layer_types": ["linear_attention", "full_attention"] * 2,
        },
        known={
            "*": "three missing pieces, in the order they stop it: (1) resolving the model class imports numba (kimi_k25_vision_fused.py:23, is_numba_available), so llvmlite is loaded when vLLM's CPU platform registers its Triton kernel overrides, and triton_utils/dispatcher.py:139 (vars(value).get) trips on llvmlite.binding.ffi.lib, whose __getattr__ serves '__dict__' as a C function ('_lib_fn_wrapper' object has no attribute 'get'; in-process engines, as the suite runs); (2) with a separate worker, models/kimi_k3/nvidia/model.py:184 imports a CUDA cute-dsl GEMM (VLLM_KIMI_K3_GEMM_AR defaults to 1: No module named 'cutlass'); (3) Kimi delta attention (models/kimi_k3/nvidia/kda.py, _forward) has FLA Triton / FlashInfer kernels only (chunk_kda_with_fused_gate, fused_recurrent_kda), no CPU path; fp32 would also need MLA in fp32, which vLLM CPU lacks"
        },
    ),
    Arch(
        "AXK1ForCausalLM",
        ("skt/A.X-K1",),
        "MLA, MoE with shared expert",
        {"first_k_dense_replace": 0, **MLA, "n_group": 2, "topk_group": 1},
    ),
    Arch(
        "MiniCPM3ForCausalLM",
        ("openbmb/MiniCPM3-4B",),
        "MLA-style attention, muP scaling",
        {
            "kv_lora_rank": 64,
            "q_lora_rank": 64,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 16,
        },
    ),
    Arch(
        "LongcatFlashForCausalLM",
        ("meituan-longcat/LongCat-Flash-Chat",),
        "MLA, shortcut-connected MoE with zero experts",
        {
            "zero_expert_type": "identity",
            "zero_expert_num": 4,
            "num_layers": 2,
            "mla_scale_q_lora": True,
            "mla_scale_kv_lora": True,
            **MLA,
        },
        known={
            "*": "the Hub format and transformers 5.19 disagree on the zero experts: LongCat-Flash checkpoints hold weights for the routed experts only, and vLLM's longcat_flash.py maps those only; transformers' LongcatFlashExperts (modeling_longcat_flash.py:170) allocates gate_up_proj for n_routed_experts + zero_expert_num experts, so it saves gate/up weights for the zero (identity) experts (vLLM: KeyError layers.0.mlp.experts.10.gate_proj.weight; experts 8-11 are the zero ones here) and cannot load a checkpoint without them (size mismatch 8 vs 12 experts); no one checkpoint serves both"
        },
    ),
    # --- GLM
    Arch(
        "Glm4ForCausalLM",
        ("THUDM/GLM-4-9B-0414", "zai-org/GLM-4-32B-0414"),
        "partial rotary (interleaved), attention biases, sandwich norms",
        family="GLM-4",
    ),
    Arch(
        "Glm4MoeForCausalLM",
        ("zai-org/GLM-4.5-Air", "zai-org/GLM-4.6"),
        "MoE sigmoid routing with bias, shared expert, partial rotary",
        {"head_dim": 32},
        family="GLM-4-MoE",
    ),
    Arch(
        "Glm4MoeLiteForCausalLM",
        ("zai-org/GLM-4.7-Flash",),
        "MLA + MoE",
        {"first_k_dense_replace": 1, **MLA},
        family="GLM-4-MoE",
        gain=8.0,
    ),
    Arch(
        "GlmMoeDsaForCausalLM",
        ("zai-org/GLM-5",),
        "MLA + DeepSeek sparse attention, MoE",
        {**MLA, "index_head_dim": 128},
        family="GLM-4-MoE",
        known={
            "*": "DeepSeek sparse attention (the indexer) has no CPU backend in vLLM 0.32 (NotImplementedError: Sparse Attention is not supported on CPU)"
        },
    ),
    # --- MiMo
    Arch(
        "MiMoV2FlashForCausalLM",
        ("XiaomiMiMo/MiMo-V2-Flash",),
        "hybrid sliding/full attention with sinks, different v head dim, MoE",
        # qk 96 / v 64: the Hub's 192/128 halved, so that the 0.334 partial rotary
        # factor gives an even rotary width (32) as the real one does (64)
        {"head_dim": 96, "v_head_dim": 64, "num_hidden_layers": 3},
        family="MiMo-V2-Flash",
        gain=8.0,
        hub_format="mimo_v2_flash",
        known={
            "int4-eager": "MoE routing near tie, not the kernels (`python -m vllm_x86.tools.conformance.routing MiMoV2FlashForCausalLM x86_int4`; the range-search rounding of 2026-12-05): the same weights are quantized on both sides; at prompt position 16 the fake-quantized fp32 reference ranks layer 1's 2nd and 3rd experts 0.0003 apart (sigmoid scores), less than the 0.0022 by which vLLM's bf16 router inputs move the scores, and vLLM routes to the other expert (layer 2 follows at the same position, margin 0.0128 against 0.024). Given vLLM's router inputs at that position, the reference's log-probs are within 0.18 of vLLM's (2.61 without; tolerance 0.84) and it gives vLLM's next token (356)",
        },
    ),
    # --- Gemma
    Arch(
        "GemmaForCausalLM",
        ("google/gemma-2b-it", "google/gemma-7b"),
        "GeGLU, (1+w) RMSNorm, embedding scale",
        family="Gemma 1-3",
        gain=8.0,
    ),
    Arch(
        "Gemma2ForCausalLM",
        ("google/gemma-2-2b-it", "google/gemma-2-9b-it"),
        "alternating sliding/global attention, attention and final logit soft-capping",
        family="Gemma 1-3",
    ),
    Arch(
        "Gemma3ForCausalLM",
        ("google/gemma-3-270m", "google/gemma-3-1b-it"),
        "5:1 sliding/global attention, q/k norms, two rope bases",
        {"num_hidden_layers": 3, "sliding_window_pattern": 2},
        family="Gemma 1-3",
    ),
    Arch(
        "Gemma3nForCausalLM",
        ("google/gemma-3n-E2B-it",),
        "AltUp, Laurel, per-layer inputs, KV sharing, activation sparsity",
        {
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "num_kv_shared_layers": 2,
            "intermediate_size": [256] * 4,
            "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0],
            "vocab_size_per_layer_input": 512,
            "hidden_size_per_layer_input": 32,
            "laurel_rank": 16,
        },
    ),
    Arch(
        "Gemma4ForCausalLM",
        ("google/gemma-4-E2B-it",),
        "sliding/global attention, proportional partial rope, per-layer inputs",
    ),
    # --- Phi, GPT-OSS, OLMo, Granite, Ernie
    Arch(
        "Phi3ForCausalLM",
        ("microsoft/Phi-3-mini-4k-instruct", "microsoft/Phi-4-mini-instruct"),
        "fused qkv and gate/up projections",
        family="Phi-3",
    ),
    Arch(
        "GptOssForCausalLM",
        ("openai/gpt-oss-20b", "openai/gpt-oss-120b"),
        "MoE with clamped SwiGLU and biases, attention sinks, alternating sliding window, YaRN",
        family="GPT-OSS",
        known={
            "bf16-eager": "MoE routing near tie, no op less precise: at prompt position 11 layer 1's router ranks experts 7 and 5 (2nd/3rd) 0.0027 apart in fp32; bf16 activation rounding moves that gap by ~0.004 and vLLM's bf16 picks expert 5 where transformers' bf16 keeps 7, so that one position's log-prob is off by 1.12 (the other 22 within 0.09; tolerance 0.69). On identical inputs every vLLM bf16 op (sink attention, router, MoE) is as close to fp32 math with the bf16 weights as transformers' bf16 (mean abs error of the MoE output 0.0016 vs 0.0029), and an fp32 router on vLLM's inputs picks the same experts",
        },
    ),
    Arch(
        "OlmoeForCausalLM",
        ("allenai/OLMoE-1B-7B-0924-Instruct",),
        "MoE 8 experts top-2, q/k norms",
        family="OLMoE",
    ),
    Arch(
        "OlmoHybridForCausalLM",
        ("allenai/Olmo-Hybrid-7B",),
        "hybrid Gated DeltaNet + full attention",
        {
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "num_hidden_layers": 4,
        },
        hub_format="olmo_hybrid",
    ),
    Arch(
        "GraniteForCausalLM",
        ("ibm-granite/granite-3.3-8b-instruct",),
        "muP multipliers (embedding, residual, attention, logits)",
        {
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.0078125,
            "logits_scaling": 8.0,
        },
        family="Granite",
    ),
    Arch(
        "GraniteMoeForCausalLM",
        ("ibm-granite/granite-3.1-3b-a800m-instruct",),
        "MoE, muP multipliers",
        family="Granite",
    ),
    Arch(
        "GraniteMoeSharedForCausalLM",
        ("ibm-research/moe-7b-1b-active-shared-experts",),
        "MoE with shared expert, muP multipliers",
        {"shared_intermediate_size": 64},
        family="Granite",
        known={
            "int4-eager@no-amx": "MoE routing near tie, not the kernels (`python -m vllm_x86.tools.conformance.routing GraniteMoeSharedForCausalLM x86_int4`; AMD EPYC, AVX-512 VNNI kernels; passes on the Xeon with AMX): the same weights are quantized on both sides; at prompt position 9 the fake-quantized fp32 reference ranks layer 1's 2nd and 3rd experts 0.0135 apart, less than the 0.0187 by which vLLM's bf16 router inputs move the logits there, and vLLM routes to the other expert. Given vLLM's router input at that position, the reference's prompt log-probs are within 0.17 of vLLM's (1.73 without; tolerance 1.04) and it gives vLLM's greedy token 0",
        },
    ),
    Arch(
        "GraniteMoeHybridForCausalLM",
        ("ibm-granite/granite-4.0-h-tiny", "ibm-granite/granite-4.0-micro"),
        "hybrid Mamba2 + attention, MoE with shared expert",
        {
            "num_hidden_layers": 4,
            "layer_types": ["linear_attention", "full_attention"] * 2,
            "mamba_n_heads": 8,
            "mamba_d_head": 32,
            "mamba_d_state": 16,
            "mamba_chunk_size": 16,
        },
        family="Granite",
        known={
            "int8-eager": "MoE routing near tie, not the kernels (`python -m vllm_x86.tools.conformance.routing GraniteMoeHybridForCausalLM x86_int8`): the same weights are quantized on both sides; at prompt position 10 the fake-quantized fp32 reference ranks layer 3's 2nd and 3rd experts 0.0136 apart, less than the 0.022 by which vLLM's bf16 router inputs move the logits there, and vLLM routes to the other expert. Given vLLM's router input at that position, the reference's prompt log-probs are within 0.15 of vLLM's (2.11 without; tolerance 0.97)",
        },
    ),
    Arch(
        "GraniteSWAForCausalLM",
        ("ibm-granite/granite-4.1",),
        "sliding window layers, muP multipliers",
        {"num_hidden_layers": 3},
        family="Granite",
    ),
    Arch(
        "GraniteMoeSWAForCausalLM",
        ("ibm-granite/granite-4.1-moe",),
        "sliding window layers, MoE",
        {"num_hidden_layers": 3},
        family="Granite",
        known={
            "bf16-eager": "MoE routing near ties, no op less precise: layer 0's router ranks its 2nd/3rd experts 0.017 apart at prompt position 5 and 0.002 at position 23 in fp32; bf16 rounding shrinks the first gap to ~0.002 in both implementations and vLLM's bf16 picks the other expert at both positions where transformers' bf16 does not. Later positions attend to the changed hidden states (more flips follow in layers 1-2): prompt log-probs off by up to 5.1 and greedy token 4 3.6 below fp32's best logit (tolerance 3.3). On identical inputs every vLLM bf16 op (attention, router, MoE) is as close to fp32 math with the bf16 weights as transformers' bf16 (mean abs error of attention 0.0033 vs 0.0038, MoE 0.0010 vs 0.0018), and an fp32 router on vLLM's inputs picks the same experts",
            "bf16-compiled": "MoE routing near tie: at the last prompt position layer 0's router ranks experts 1 and 4 (2nd/3rd) 0.0022 apart in fp32; forcing expert 4 there in transformers fp32 gives the distribution vLLM compiled bf16 produces for greedy token 0 (209 -1.27, 261 -1.52, 380 -1.77 against vLLM's 209 -1.17, 261 -1.48, 380 -2.05), so vLLM picks 209 where fp32 picks 380; prompt log-probs within tolerance (1.05 < 3.26)",
        },
    ),
    Arch(
        "Ernie4_5ForCausalLM",
        ("baidu/ERNIE-4.5-0.3B-PT",),
        "GQA, interleaved rope, tied embeddings",
        family="Ernie 4.5",
    ),
    Arch(
        "Ernie4_5_MoeForCausalLM",
        ("baidu/ERNIE-4.5-21B-A3B-PT",),
        "MoE with shared experts and expert bias correction",
        {"moe_layer_start_index": 1, "moe_layer_end_index": 1},
        family="Ernie 4.5",
    ),
    # --- other MoE
    Arch(
        "AfmoeForCausalLM",
        ("arcee-ai/Trinity-Mini",),
        "MoE, sliding/global attention, gated attention",
        {
            "n_group": 1,
            "topk_group": 1,
            "score_func": "sigmoid",
            "route_norm": True,
            "num_hidden_layers": 3,
            "num_dense_layers": 1,
            "global_attn_every_n_layers": 2,
        },
    ),
    Arch(
        "Cohere2MoeForCausalLM",
        ("CohereLabs/command-a-moe",),
        "MoE, sliding window, parallel block",
        known={
            "*": "vLLM and transformers disagree on the sliding window's width: vLLM's cohere2_moe.py:213 gives sliding layers a window of sliding_window + 1 tokens ([pos - W, pos]), transformers' masking_utils.py:100 (sliding_window_overlay: kv_idx > q_idx - W) one of W tokens. Checked: transformers with sliding_window = W + 1 reproduces vLLM's fp32 output (first token 346, prompt log-prob difference 1.868, from position 17 on)"
        },
    ),
    Arch(
        "DbrxForCausalLM",
        ("databricks/dbrx-instruct",),
        "MoE, clipped qkv",
        {
            "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
            "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 8, "moe_top_k": 2},
        },
        gain=8.0,
        known={
            "*": "vLLM 0.32's DBRX loader is broken for every DBRX checkpoint (this one has the Hub's names, transformer.blocks.N.ffn.experts.mlp.w1/v1/w2): DbrxModel.load_weights (dbrx.py:397-406) maps them to blocks.N.ffn.experts.w13_weight / w2_weight, but since the MoE refactor FusedMoEFactory returns a MoERunner whose expert parameters live under experts.routed_experts.* (KeyError blocks.0.ffn.experts.w13_weight); not a checkpoint-format or CPU-op matter"
        },
    ),
    Arch(
        "ExaoneMoeForCausalLM",
        ("LGAI-EXAONE/K-EXAONE-236B-A23B",),
        "MoE with shared expert, sliding window",
        known={
            "int8-eager": "MoE routing near ties, not the kernels (`python -m vllm_x86.tools.conformance.routing ExaoneMoeForCausalLM x86_int8`): the same weights are quantized on both sides; at prompt positions 20 and 23 the fake-quantized fp32 reference ranks layer 1's 2nd and 3rd experts 0.0009 and 0.0010 apart (sigmoid + bias scores), less than the 0.0015 by which vLLM's bf16 router inputs move the scores, and vLLM routes to the other expert at both. Given vLLM's router inputs at those two positions, the reference gives vLLM's greedy token 0 (457; 413 without) and prompt log-probs within 0.10 of vLLM's (3.59 without; tolerance 14.5: transformers' own bf16 run is 3.6 off)",
        },
    ),
    Arch(
        "HYV3ForCausalLM",
        ("tencent/Hunyuan-V3",),
        "MoE with shared expert, q/k norms",
        {"expert_hidden_dim": 64, "route_norm": True, "first_k_dense_replace": 1},
        hub_format="hy_v3",
    ),
    Arch(
        "HYV4ForCausalLM",
        ("tencent/Hunyuan-V4",),
        "MLA + sparse indexer, hyper-connections, MoE",
        {**MLA, "index_head_dim": 128},
        known={
            "*": "no sparse MLA backend for HYV4's indexed attention on CPU in vLLM 0.32 (it refuses to fall back to dense attention)"
        },
    ),
    Arch(
        "InklingForCausalLM",
        ("inkling/Inkling",),
        "hybrid sliding attention + conv, MoE",
        {
            "layer_types": ["hybrid_sliding", "hybrid"],
            "swa_num_attention_heads": 4,
            "swa_num_key_value_heads": 2,
            "swa_head_dim": 32,
        },
        # vLLM defaults Inkling to its chat renderer, which wants a tokenizer with
        # Inkling's special tokens even under skip_tokenizer_init; the suite sends
        # token ids, so the plain renderer serves (the model's compute is the same)
        engine={"tokenizer_mode": "hf"},
        known={
            "*": "the two InklingForCausalLM classes read different checkpoint formats: vLLM's (models/inkling/nvidia/model.py) reads the original text-only 'inkling_model' format (configs.py InklingModelConfig: padded_vocab_size, local_layer_ids, dense_mlp_idx; weights model.llm.*, attn.wq_du/wk_dv/wv_dv/wr_du, interleaved mlp.w13_dn), transformers 5.19 writes and reads 'inkling_text' with its own names and converts the original names only for the multimodal 'inkling_mm_model' checkpoints (conversion_mapping.py:179); vLLM stops at AttributeError: 'InklingTextConfig' object has no attribute 'padded_vocab_size'"
        },
    ),
    Arch(
        "InklingForConditionalGeneration",
        ("inkling/Inkling",),
        "Inkling wrapped for multimodal checkpoints",
        skip="not run: the tiny builder shrinks text configs only, and this class builds a "
        "full-size vision tower (36 GiB)",
    ),
    Arch(
        "LagunaForCausalLM",
        ("poolside/Laguna",),
        "MoE, gated attention, per-layer heads, partial rotary",
        known={
            "int8-eager": "MoE routing near tie, not the kernels (`python -m vllm_x86.tools.conformance.routing LagunaForCausalLM x86_int8`): the same weights are quantized on both sides; at prompt position 9 the fake-quantized fp32 reference ranks layer 1's 2nd and 3rd experts 0.0012 apart (sigmoid + bias scores), less than the 0.0022 by which vLLM's bf16 router inputs move the scores, and vLLM routes to the other expert. Given vLLM's router input at that position, the reference's prompt log-probs are within 0.16 of vLLM's (1.05 without; tolerance 0.76)",
        },
    ),
    Arch(
        "Lfm2MoeForCausalLM",
        ("LiquidAI/LFM2-8B-A1B",),
        "short convolutions + attention, MoE",
        {
            "num_hidden_layers": 3,
            "layer_types": ["conv", "full_attention", "conv"],
            "num_dense_layers": 1,
        },
    ),
    Arch(
        "MiniMaxM2ForCausalLM",
        ("MiniMaxAI/MiniMax-M2",),
        "MoE sigmoid routing, q/k norms, partial rotary",
        {"rotary_dim": 16, "scoring_func": "sigmoid", "use_routing_bias": True},
        known={
            "int8-eager": "MoE routing near ties, not the kernels (`python -m vllm_x86.tools.conformance.routing MiniMaxM2ForCausalLM x86_int8 2`): the same weights are quantized on both sides; the fake-quantized fp32 reference ranks its 2nd and 3rd experts 0.0004 apart at prompt position 17 in layer 1 and 0.0001 apart at the step of greedy token 2 in layer 0 (sigmoid + bias scores), less than the ~0.001 by which vLLM's bf16 router inputs move the scores, and vLLM routes to the other expert at both. Given vLLM's router inputs at those two positions, the reference gives vLLM's token 2 (11; 386 without, 11 5.0 below it) and log-probs within 0.11 of vLLM's (3.33 without)",
        },
    ),
    Arch(
        "JambaForCausalLM",
        ("ai21labs/AI21-Jamba-Mini-1.7",),
        "hybrid Mamba + attention, MoE",
        {
            "num_hidden_layers": 4,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 4,
            "mamba_dt_rank": 8,
        },
    ),
    # --- dense, other families
    Arch(
        "CohereForCausalLM",
        ("CohereLabs/c4ai-command-r-v01",),
        "parallel attention/MLP block, LayerNorm, logit scale",
        gain=8.0,
    ),
    Arch(
        "Cohere2ForCausalLM",
        ("CohereLabs/c4ai-command-r7b-12-2024",),
        "sliding window with NoPE global layers",
        {"num_hidden_layers": 3, "sliding_window_pattern": 2},
        known={
            "*": "vLLM and transformers disagree on the sliding window's width: vLLM's commandr.py:244 gives Cohere2's sliding layers a window of sliding_window + 1 tokens ([pos - W, pos], 'the training convention'), transformers' masking_utils.py:100 (sliding_window_overlay: kv_idx > q_idx - W) one of W tokens. Checked: transformers with sliding_window = W + 1 reproduces vLLM's fp32 output (token 8 = 340, prompt log-prob difference 0.598, from position 17 on)"
        },
    ),
    Arch(
        "Exaone4ForCausalLM",
        ("LGAI-EXAONE/EXAONE-4.0-1.2B",),
        "sliding/global hybrid, q/k norms, post-norms",
        {"num_hidden_layers": 3, "sliding_window_pattern": 2},
    ),
    Arch(
        "FalconForCausalLM",
        ("tiiuae/falcon-7b",),
        "multi-query attention, parallel block",
        {"ffn_hidden_size": 512},
    ),
    Arch(
        "BloomForCausalLM",
        ("bigscience/bloom-560m",),
        "ALiBi, embedding LayerNorm",
        gain=16.0,
        known={
            "fp32-eager": _BLOOM_GELU,
            "fp32-compiled": _BLOOM_GELU,
        },
    ),
    Arch(
        "GPT2LMHeadModel",
        ("openai-community/gpt2", "distilbert/distilgpt2"),
        "learned positions, LayerNorm, GELU",
        gain=8.0,
    ),
    Arch(
        "GPTJForCausalLM",
        ("EleutherAI/gpt-j-6b",),
        "partial interleaved rotary, parallel block",
    ),
    Arch("OPTForCausalLM", ("facebook/opt-125m",), "learned positions with offset, ReLU"),
    Arch(
        "NemotronForCausalLM",
        ("nvidia/Minitron-8B-Base",),
        "ReLU^2, LayerNorm1p, partial rotary",
    ),
    Arch(
        "StableLmForCausalLM",
        ("stabilityai/stablelm-2-1_6b",),
        "partial rotary, LayerNorm, qkv bias",
        {"use_qkv_bias": True},
    ),
    Arch(
        "HrmTextForCausalLM",
        ("sapientinc/HRM-Text",),
        "hierarchical recurrent stacks, PrefixLM (bidirectional prompt)",
    ),
    Arch(
        "Lfm2ForCausalLM",
        ("LiquidAI/LFM2-1.2B",),
        "short convolutions + attention",
        {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"]},
        hub_format="lfm2",
    ),
    # --- state space and hybrids
    Arch(
        "MambaForCausalLM",
        ("state-spaces/mamba-130m-hf",),
        "Mamba-1 selective scan",
        {"state_size": 16, "time_step_rank": 8},
    ),
    Arch(
        "FalconMambaForCausalLM",
        ("tiiuae/falcon-mamba-7b",),
        "Mamba-1 with RMS-normed B/C/dt",
        {"state_size": 16, "time_step_rank": 8},
    ),
    Arch(
        "Mamba2ForCausalLM",
        ("state-spaces/mamba2-130m",),
        "Mamba-2 SSD",
        {
            "num_heads": 8,
            "head_dim": 32,
            "state_size": 16,
            "n_groups": 1,
            "chunk_size": 16,
        },
    ),
    Arch(
        "FalconH1ForCausalLM",
        ("tiiuae/Falcon-H1-0.5B-Instruct",),
        "parallel Mamba-2 + attention, muP multipliers",
        {
            "mamba_d_ssm": 256,
            "mamba_n_heads": 8,
            "mamba_d_head": 32,
            "mamba_d_state": 16,
            "mamba_chunk_size": 16,
        },
    ),
    Arch(
        "NemotronHForCausalLM",
        ("nvidia/NVIDIA-Nemotron-Nano-9B-v2",),
        "hybrid Mamba-2 + attention + ReLU² MLP blocks (the 9B v2 layout, no MoE)",
        {
            "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp"],
            "mamba_num_heads": 8,
            "mamba_head_dim": 32,
            "ssm_state_size": 16,
            "n_groups": 1,
            "chunk_size": 16,
        },
    ),
    Arch(
        "Zamba2ForCausalLM",
        ("Zyphra/Zamba2-1.2B-instruct",),
        "Mamba-2 with shared attention blocks",
        {
            "num_hidden_layers": 4,
            "layers_block_type": ["linear_attention", "hybrid"] * 2,
            "mamba_d_state": 16,
            "n_mamba_heads": 4,
            "mamba_headdim": 64,
            "chunk_size": 16,
            "adapter_rank": 8,
            # Zamba2's shared attention has as many KV heads as query heads (as every
            # Zyphra checkpoint); vLLM's zamba2.py builds it without GQA
            "num_key_value_heads": 4,
        },
        known={
            "int8-eager": "the random tiny model amplifies rounding, not the kernels: the same weights are quantized on both sides, and transformers' own bf16 run of the fake-quantized weights is 3.71 off its fp32 run in prompt log-probs and parts from it at greedy token 0 too (vLLM: 3.77). vLLM's token 0 (135) is 3.16 below the fp32 reference's best (40; measured with `python -m vllm_x86.tools.conformance.routing Zamba2ForCausalLM x86_int8`), within the bf16 rule's tie tolerance (14.9), but the reference records only its 8 best tokens, so the rule cannot place it",
        },
    ),
)

BY_NAME: dict[str, Arch] = {a.name: a for a in ARCHS}
MODES = ("fp32-eager", "bf16-eager", "fp32-compiled", "bf16-compiled", "int8-eager", "int4-eager")
# bf16 models served with --quantization x86_int8 / x86_int4 (conformance.py QUANT)
QUANT_MODES = ("int8-eager", "int4-eager")
# The architectures whose quantized modes the pytest suite runs by default (the CI
# budget): dense Llama-likes with and without biases, q/k norms, Gemma's norms and
# sliding windows, Phi-3's fused projections, an MoE, GLM-4's post-norms. The whole
# matrix runs them all: python -m vllm_x86.tools.conformance.suite --modes int8-eager,int4-eager
QUANT_CI_ARCHS = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
    "Glm4ForCausalLM",
)
# The architectures whose bf16-eager mode the pytest suite runs by default (the CI
# budget; fp32 eager runs for every one): each distinct path a bf16 model takes through
# the op table (ops/registry.py) and vLLM's CPU layers, once. Chosen from a bf16 op
# inventory of every passing row (conformance.op_inventory, 2026-12-06): the rows left
# out run only ops, attention kinds, routers, rope variants and biased layers one of
# these runs too; what is theirs alone is their vLLM model file (and OPT's torch ReLU).
# The rows that fail bf16 eager (xfail) are left out too: an xfail holds no op to a
# result (whether one starts passing is for the full runs), and each engine that fails
# to start costs the suite a fresh worker process. The whole column
# runs them all: python -m vllm_x86.tools.conformance.suite --modes bf16-eager (or
# pytest ... --modes fp32-eager,bf16-eager); docs/supported_models.md is written from
# such full runs.
BF16_CI_ARCHS = (
    # RMSNorm (x86 IR op), the float32 residual fused add + RMSNorm and the float32 best
    # logits of the LM head (both bf16-only rows), SiluAndMul, llama3 rope, plain attention
    "LlamaForCausalLM",
    # YaRN rope with llama-4 attention scaling (the only YaRN row passing bf16)
    "Ministral3ForCausalLM",
    # the plugin's xIELU row (vLLM's bf16 coefficients in bf16), q/k norms
    "ApertusForCausalLM",
    # chunked local attention, top-1 router on the input (GateLinear), NoPE layers,
    # q/k L2 norm, shared expert
    "Llama4ForCausalLM",
    # q/k/v biases, tied embeddings (the exact-logits row on the embedding's weight)
    "Qwen2ForCausalLM",
    # the plugin's fused split + q/k norm + rope module (X86Qwen3Attention)
    "Qwen3ForCausalLM",
    # the same for the MoE attention class (its own row); softmax top-k renormalized, MoE
    "Qwen3MoeForCausalLM",
    # Gated DeltaNet on vLLM's bf16 CPU kernels (the plugin's GDN row keeps them in bf16),
    # RMSNormGated, gated attention, partial neox rope
    "Qwen3_5ForCausalLM",
    # MLA (vLLM CPU's MLA backend), softmax group-limited routing (the only one), shared
    # experts, interleaved (non-neox) rope
    "DeepseekV2ForCausalLM",
    # partial interleaved rope, attention biases, sandwich norms
    "Glm4ForCausalLM",
    # the plugin's DiffKV attention backend (V head 64, QK head 96), attention sinks in
    # sliding layers, sigmoid group-limited routing with correction bias
    "MiMoV2FlashForCausalLM",
    # attention and final logit soft-capping (vLLM's LM head path: the exact-logits row
    # declines soft-capped logits)
    "Gemma2ForCausalLM",
    # (1+w) RMSNorm, GeluAndMul (tanh), sliding/global attention, q/k norms, two rope bases
    "Gemma3ForCausalLM",
    # KV sharing, sparse GELU (GeluAndMulSparse), AltUp, Laurel, per-layer inputs
    "Gemma3nForCausalLM",
    # the Gemma-4 rope row (proportional partial rope), head size 512
    "Gemma4ForCausalLM",
    # attention sinks on vLLM's CPU attention, sliding window, muP residual (no fused add)
    "GraniteSWAForCausalLM",
    # ALiBi, GELU, embedding LayerNorm, biases; its fp32 case is an xfail (vLLM's erf
    # GELU), so bf16 is its only passing check
    "BloomForCausalLM",
    # NewGELU, LayerNorm, learned positions, biases everywhere
    "GPT2LMHeadModel",
    # ReLU², LayerNorm1P, partial neox rope
    "NemotronForCausalLM",
    # PrefixLM attention (bidirectional prompt)
    "HrmTextForCausalLM",
    # short convolutions
    "Lfm2ForCausalLM",
    # the plugin's Mamba-1 mixer row (bf16 packs the conv weight), without RMS norms
    "MambaForCausalLM",
    # the same mixer with RMS-normed B/C/dt, beside attention layers; MoE
    "JambaForCausalLM",
    # vLLM's Mamba-2 mixer and its gated RMSNorm, GeluAndMul (erf: the only one), head
    # size 64, shared attention blocks
    "Zamba2ForCausalLM",
    # the plugin's OLMo-Hybrid GDN layer row (its float32 delta rule in every dtype)
    "OlmoHybridForCausalLM",
    # the plugin's MoE router row (sigmoid top-k without groups, with bias), MiniMax's
    # RMSNorm
    "MiniMaxM2ForCausalLM",
)


def cpu_tag() -> str:
    """ "amx" or "no-amx": which of an Arch's CPU-specific `known` entries apply here."""
    from vllm_x86.runtime import hardware

    return "amx" if hardware.cpu_info().isa_level == "amx" else "no-amx"


def known_failure(arch: Arch, mode: str) -> str | None:
    return arch.known.get(f"{mode}@{cpu_tag()}") or arch.known.get(mode) or arch.known.get("*")


def not_run_reason(arch: Arch, mode: str) -> str | None:
    """Why the suite does not run `mode` for `arch`: the row's ``skip``, or for a
    quantized mode an architecture that fails bf16 eager (the quantized modes run in
    bf16; that reason stands for them)."""
    if arch.skip:
        return arch.skip
    if mode in QUANT_MODES:
        bf16 = known_failure(arch, "bf16-eager")
        if bf16:
            return f"not run: bf16 eager does not pass ({bf16})"
    return None
