// The one binding file: the C++ implementations of the torch.ops.vllm_x86.* ops, and the
// ISA controls exposed to Python as vllm_x86.runtime._C. The ops' schemas (vLLM's `_C`
// op names and argument orders) and fake implementations are declared once, in Python:
// vllm_x86/runtime/ops/schemas.py. Here only their CPU kernels are registered.
#include <torch/extension.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY_IMPL(vllm_x86, CPU, m) {
  m.impl("rms_norm", &vllm_x86::rms_norm);
  m.impl("fused_add_rms_norm", &vllm_x86::fused_add_rms_norm);
  m.impl("fused_add_rms_norm_f32res", &vllm_x86::fused_add_rms_norm_f32res);
  m.impl("rotary_embedding", &vllm_x86::rotary_embedding);
  m.impl("silu_and_mul", &vllm_x86::silu_and_mul);
  m.impl("gelu_and_mul", &vllm_x86::gelu_and_mul);
  m.impl("gelu_tanh_and_mul", &vllm_x86::gelu_tanh_and_mul);
  m.impl("split_norm_rope_neox", &vllm_x86::split_norm_rope_neox);
  m.impl("decode_attention", &vllm_x86::decode_attention);
  m.impl("refine_top_logits", &vllm_x86::refine_top_logits);
  m.impl("int8_w8a16_gemm", &vllm_x86::int8_w8a16_gemm);
  m.impl("int4_w4a16_gemm", &vllm_x86::int4_w4a16_gemm);
  m.impl("decode_layer", &vllm_x86::decode_layer);
  m.impl("decode_stack", &vllm_x86::decode_stack);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "vllm-x86 CPU kernels (ops are under torch.ops.vllm_x86)";
  m.def("set_cpu_isas", &vllm_x86::set_cpu_isas,
        "Tell the library what this CPU and process can run (vllm_x86/runtime/hardware.py's "
        "usable_isas(); ops/kernels.py does at load); picks the best of each family");
  m.def("cpu_isas", &vllm_x86::cpu_isas, "What the library was told this CPU can run");
  m.def("isa", &vllm_x86::isa, "The ISA whose elementwise kernels run now");
  m.def("set_isa", &vllm_x86::set_isa,
        "Pick the elementwise kernels' ISA: auto, avx2, avx512, avx512_bf16 (one the CPU can "
        "run)");
  m.def("quant_isa", &vllm_x86::quant_isa,
        "The INT8/INT4 GEMM kernels that run: amx, avx512_vnni, or empty (none can run)");
  m.def("set_quant_isa", &vllm_x86::set_quant_isa,
        "Pick the INT8/INT4 GEMM kernels: auto, amx, avx512_vnni (one the CPU can run)");
  m.def("quant_a8_rows", &vllm_x86::quant_a8_rows,
        "From how many rows the AVX-512 VNNI INT8/INT4 kernels use 8-bit activations (0: never)");
  m.def("set_quant_a8_rows", &vllm_x86::set_quant_a8_rows,
        "Set from how many rows the AVX-512 VNNI INT8/INT4 kernels use 8-bit activations "
        "(0: never)");
  m.def("quant_vnni_rows", &vllm_x86::quant_vnni_rows,
        "Up to how many rows INT4 GEMMs run the AVX-512 VNNI kernel on an AMX CPU (0: never)");
  m.def("set_quant_vnni_rows", &vllm_x86::set_quant_vnni_rows,
        "Set up to how many rows INT4 GEMMs run the AVX-512 VNNI kernel on an AMX CPU "
        "(0: never)");
  m.def("int4_kernel", &vllm_x86::int4_kernel,
        "The kernels an INT4 GEMM of m rows runs now: amx, avx512_vnni, or empty");
  m.def("bind_threads", &vllm_x86::bind_threads,
        "Pin OpenMP thread t of this thread's team to cpus[t]");
}
