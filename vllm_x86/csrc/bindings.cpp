// The one binding file: registers every op of vllm-x86 with PyTorch under the
// `vllm_x86` namespace (torch.ops.vllm_x86.*), with vLLM's `_C` op names and argument
// orders, and exposes the ISA controls to Python as vllm_x86._C.
#include <torch/extension.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(vllm_x86, m) {
  m.def("rms_norm(Tensor! out, Tensor input, Tensor? weight, float epsilon) -> ()");
  m.impl("rms_norm", torch::kCPU, &vllm_x86::rms_norm);
  m.def(
      "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> "
      "()");
  m.impl("fused_add_rms_norm", torch::kCPU, &vllm_x86::fused_add_rms_norm);
  m.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox) -> ()");
  m.impl("rotary_embedding", torch::kCPU, &vllm_x86::rotary_embedding);
  m.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  m.impl("silu_and_mul", torch::kCPU, &vllm_x86::silu_and_mul);
  m.def("gelu_and_mul(Tensor! out, Tensor input) -> ()");
  m.impl("gelu_and_mul", torch::kCPU, &vllm_x86::gelu_and_mul);
  m.def("gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()");
  m.impl("gelu_tanh_and_mul", torch::kCPU, &vllm_x86::gelu_tanh_and_mul);
  m.def(
      "split_norm_rope_neox(Tensor! q_out, Tensor! k_out, Tensor! v_out, Tensor qkv, "
      "Tensor positions, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, "
      "int num_heads, int num_kv_heads, int head_size, float epsilon) -> ()");
  m.impl("split_norm_rope_neox", torch::kCPU, &vllm_x86::split_norm_rope_neox);
  m.def("int8_w8a16_gemm(Tensor x, Tensor w, Tensor scale, Tensor? bias) -> Tensor");
  m.impl("int8_w8a16_gemm", torch::kCPU, &vllm_x86::int8_w8a16_gemm);
  m.def(
      "int4_w4a16_gemm(Tensor x, Tensor w, Tensor scale, Tensor zeros, int group_size, "
      "Tensor? bias) -> Tensor");
  m.impl("int4_w4a16_gemm", torch::kCPU, &vllm_x86::int4_w4a16_gemm);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "vllm-x86 CPU kernels (ops are under torch.ops.vllm_x86)";
  m.def("isa", &vllm_x86::isa, "The ISA whose kernels run now");
  m.def("available_isas", &vllm_x86::available_isas, "ISAs this CPU can run");
  m.def("amx_available", &vllm_x86::amx_available,
        "Whether the AMX kernels can run here (asks Linux for the tile state)");
  m.def("quant_isa", &vllm_x86::quant_isa,
        "The INT8/INT4 GEMM kernels that run: amx, avx512_vnni, or empty (none can run)");
  m.def("set_quant_isa", &vllm_x86::set_quant_isa,
        "Pick the INT8/INT4 GEMM kernels: auto, amx, avx512_vnni (for comparisons)");
  m.def("quant_a8_rows", &vllm_x86::quant_a8_rows,
        "From how many rows the AVX-512 VNNI INT8/INT4 kernels use 8-bit activations (0: never)");
  m.def("set_quant_a8_rows", &vllm_x86::set_quant_a8_rows,
        "Set from how many rows the AVX-512 VNNI INT8/INT4 kernels use 8-bit activations "
        "(0: never)");
  m.def("bind_threads", &vllm_x86::bind_threads,
        "Pin OpenMP thread t of this thread's team to cpus[t]");
  m.def("set_isa", &vllm_x86::set_isa, "Pick the kernels' ISA: auto, avx2, avx512, avx512_bf16");
}
