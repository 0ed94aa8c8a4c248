// Declarations of the torch-facing ops (ops.cpp), registered in bindings.cpp (their
// schemas and fakes: vllm_x86/runtime/ops/schemas.py).
#pragma once

#include <torch/all.h>

#include <optional>
#include <string>
#include <vector>

namespace vllm_x86 {

// What this CPU and process can run (vllm_x86/runtime/hardware.py's usable_isas(),
// passed in by ops/kernels.py at load): the library probes nothing itself. Setting it
// picks the best elementwise ISA and INT8/INT4 GEMM family it allows.
std::vector<std::string> cpu_isas();
void set_cpu_isas(const std::vector<std::string>& isas);
// The elementwise kernels' ISA: avx2, avx512 or avx512_bf16 ("auto": the best told).
std::string isa();
void set_isa(const std::string& name);

void rms_norm(at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
              double epsilon);
void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual,
                        const std::optional<at::Tensor>& weight, double epsilon);
// The same with a float32 residual whatever the input's dtype (VLLM_X86_FP32_RESIDUAL):
// residual = input + residual in float32, not rounded; input = its RMSNorm, rounded.
void fused_add_rms_norm_f32res(at::Tensor& input, at::Tensor& residual,
                               const std::optional<at::Tensor>& weight, double epsilon);
void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      const std::optional<at::Tensor>& key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox);
void silu_and_mul(at::Tensor& out, const at::Tensor& input);
void gelu_and_mul(at::Tensor& out, const at::Tensor& input);
void gelu_tanh_and_mul(at::Tensor& out, const at::Tensor& input);
void split_norm_rope_neox(at::Tensor& q_out, at::Tensor& k_out, at::Tensor& v_out,
                          const at::Tensor& qkv, const at::Tensor& positions,
                          const at::Tensor& q_weight, const at::Tensor& k_weight,
                          const at::Tensor& cos_sin_cache, int64_t num_heads,
                          int64_t num_kv_heads, int64_t head_size, double epsilon);
// vLLM CPU's decode attention (one query token per row) in one call: each row's key and
// value into its slot of the paged KV cache, as _C.cpu_attn_reshape_and_cache writes
// them (layout 0: its "vec"/"vec16" ISA, 1: "amx"), then out = softmax(scale * q K^T) V
// over the row's seq_lens tokens (float32). Rows may share a sequence (a speculative
// step's tokens, each with its own length): a row reads what the rows before it wrote.
void decode_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key,
                      const at::Tensor& value, at::Tensor& kv_cache,
                      const at::Tensor& slot_mapping, const at::Tensor& block_table,
                      const at::Tensor& seq_lens, double scale, int64_t layout);
// An LM head's bf16/fp16 logits [rows, vocab] as float32, the tokens within
// |best| * rel of each row's best recomputed in float32 from hidden and weight (+ bias):
// ops/logits.py's refined logits in one pass.
at::Tensor refine_top_logits(const at::Tensor& logits, const at::Tensor& hidden,
                             const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             double rel);

// The W8A16/W4A16 kernels that run: "amx", "avx512_vnni" (same results, no AMX) or ""
// (neither can run here); set_quant_isa picks one ("auto": AMX where it can run).
std::string quant_isa();
void set_quant_isa(const std::string& name);
// From how many rows the AVX-512 VNNI kernels take 8-bit activations (a scale per 64
// inputs) instead of 16-bit ones; 0: never. The AMX kernels always keep 16 bits.
int64_t quant_a8_rows();
void set_quant_a8_rows(int64_t rows);
// With the AMX kernels chosen: INT4 GEMMs of at most this many rows run the AVX-512 VNNI
// kernel instead (same packed weights, same bits; it streams one row's weights faster);
// 0: AMX at every row count. Needs the CPU to have AVX-512 VNNI too.
int64_t quant_vnni_rows();
void set_quant_vnni_rows(int64_t rows);
// The kernels an INT4 GEMM of m rows runs now ("amx", "avx512_vnni" or "").
std::string int4_kernel(int64_t m);
// Pins OpenMP thread t of the calling thread's team to cpus[t] (team size = len(cpus));
// returns the CPU each thread then ran on (-1 where pinning failed).
std::vector<int64_t> bind_threads(const std::vector<int64_t>& cpus);
// INT8-weight linear on AMX with 16-bit activations (amx_gemm.cpp):
// bf16 [M, K] x packed int8 -> bf16 [M, N].
at::Tensor int8_w8a16_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                           const std::optional<at::Tensor>& bias);
// The same with group-wise INT4 weights.
at::Tensor int4_w4a16_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                           const at::Tensor& zeros, int64_t group_size,
                           const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> decode_layer(
    const at::Tensor& hidden, const std::optional<at::Tensor>& residual,
    const at::Tensor& positions, const std::vector<std::optional<at::Tensor>>& weights,
    const std::vector<int64_t>& ints, const std::vector<double>& floats, at::Tensor& kv_cache,
    const at::Tensor& slot_mapping, const at::Tensor& block_table, const at::Tensor& seq_lens);
std::tuple<at::Tensor, at::Tensor> decode_stack(
    const at::Tensor& hidden, const at::Tensor& positions,
    const std::vector<std::optional<at::Tensor>>& weights, const std::vector<int64_t>& ints,
    const std::vector<double>& floats, at::TensorList kv_caches, const at::Tensor& slot_mapping,
    const at::Tensor& block_table, const at::Tensor& seq_lens);

}  // namespace vllm_x86
