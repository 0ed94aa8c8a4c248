// Torch-facing ops of vllm-x86: argument checks, work split over threads, and the
// call into the kernel table of the ISA picked at run time. Built for the baseline
// x86-64 ISA, so loading the library never needs more than the machine has. Which ISAs
// the machine has is not asked here: vllm_x86/runtime/hardware.py decides and
// ops/kernels.py says so (set_cpu_isas) when it loads the library.
#include <ATen/Parallel.h>
#include <omp.h>
#include <sched.h>
#include <torch/all.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "amx_gemm.h"
#include "kernels.h"
#include "ops.h"
#include "vnni_gemm.h"

namespace vllm_x86 {

namespace {

// What this CPU and process can run: the ISA names of vllm_x86/runtime/hardware.py
// (ISA_NEEDS), handed over by ops/kernels.py when it loads the library (set_cpu_isas).
// The library probes nothing itself; until it is told, no kernel runs.
std::vector<std::string>& cpu_isas_told() {
  static std::vector<std::string> isas;
  return isas;
}

bool told(const std::string& name) {
  const auto& isas = cpu_isas_told();
  return std::find(isas.begin(), isas.end(), name) != isas.end();
}

std::string told_list() {
  std::string out;
  for (const auto& s : cpu_isas_told()) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "nothing" : out;
}

// The elementwise kernel tables, lowest ISA first.
const KernelTable* const kTables[] = {&avx2::table, &avx512::table, &avx512bf16::table};

const KernelTable* best_table() {
  const KernelTable* best = nullptr;
  for (const KernelTable* t : kTables)
    if (told(t->name)) best = t;
  return best;
}

const KernelTable* g_table = nullptr;

const KernelTable& table() {
  TORCH_CHECK(g_table != nullptr,
              "vllm-x86 kernels need AVX2, FMA and F16C, and the library was told this CPU "
              "can run ", told_list(),
              " (vllm_x86.runtime.ops.kernels tells it what vllm_x86/runtime/hardware.py finds)");
  return *g_table;
}

int dtype_code(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return kF32;
    case at::kBFloat16:
      return kBF16;
    case at::kHalf:
      return kF16;
    default:
      TORCH_CHECK(false, "vllm-x86: ", what, " must be float32, bfloat16 or float16, got ",
                  t.scalar_type());
  }
  return kF32;
}

// Rows of a tensor normalised over its last (contiguous) dimension, as (n0, n1)
// with strides (s0, s1); leading dimensions that can be merged are merged.
Rows2 rows_of(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() >= 1, "vllm-x86: ", what, " must have at least one dimension");
  TORCH_CHECK(t.stride(-1) == 1, "vllm-x86: ", what, " must be contiguous in its last dimension");
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end() - 1);
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end() - 1);
  // merge mergeable neighbours, outermost first
  std::vector<int64_t> ms, mt;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;
    if (!ms.empty() && mt.back() == strides[i] * sizes[i]) {
      ms.back() *= sizes[i];
      mt.back() = strides[i];
    } else {
      ms.push_back(sizes[i]);
      mt.push_back(strides[i]);
    }
  }
  TORCH_CHECK(ms.size() <= 2, "vllm-x86: ", what,
              " has a layout the kernels do not handle (more than two non-mergeable "
              "leading dimensions)");
  if (ms.empty()) return {1, 1, 0, 0};
  if (ms.size() == 1) return {ms[0], 1, mt[0], 0};
  return {ms[0], ms[1], mt[0], mt[1]};
}

// Per-thread float scratch of at least n elements (rows are at most a few 10k).
float* scratch_for(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

int64_t grain_for(int64_t work_per_item) {
  constexpr int64_t kMinWork = 16384;  // elements per task, below that threads cost more
  return std::max<int64_t>(1, kMinWork / std::max<int64_t>(1, work_per_item));
}

void check_weight(const std::optional<at::Tensor>& weight, const at::Tensor& x, int64_t hidden,
                  const char* op) {
  if (!weight.has_value()) return;
  TORCH_CHECK(weight->is_contiguous() && weight->numel() == hidden, "vllm-x86 ", op,
              ": weight must be contiguous with ", hidden, " elements");
  TORCH_CHECK(weight->scalar_type() == x.scalar_type(), "vllm-x86 ", op,
              ": weight dtype must equal the input dtype");
}

}  // namespace

std::string isa() { return g_table ? g_table->name : "none"; }

void set_isa(const std::string& name) {
  if (name == "auto" || name.empty()) {
    g_table = best_table();
    return;
  }
  const KernelTable* want = nullptr;
  for (const KernelTable* t : kTables)
    if (name == t->name) want = t;
  TORCH_CHECK(want != nullptr, "vllm-x86: unknown ISA '", name,
              "' (choose auto, avx2, avx512 or avx512_bf16)");
  TORCH_CHECK(told(name), "vllm-x86: this CPU cannot run the ", name,
              " kernels (it can run: ", told_list(), ")");
  g_table = want;
}

void rms_norm(at::Tensor& out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
              double epsilon) {
  const int dt = dtype_code(input, "rms_norm input");
  TORCH_CHECK(out.sizes() == input.sizes() && out.scalar_type() == input.scalar_type(),
              "vllm-x86 rms_norm: out must match input in shape and dtype");
  const int64_t hidden = input.size(-1);
  check_weight(weight, input, hidden, "rms_norm");
  Rows2 xr = rows_of(input, "rms_norm input");
  Rows2 orow = rows_of(out, "rms_norm out");
  TORCH_CHECK(xr.n0 * xr.n1 == orow.n0 * orow.n1,
              "vllm-x86 rms_norm: out and input must have the same number of rows");
  const void* w = weight.has_value() ? weight->data_ptr() : nullptr;
  const int64_t rows = xr.n0 * xr.n1;
  const auto& k = table();
  void* o = out.data_ptr();
  const void* x = input.data_ptr();
  const float eps = static_cast<float>(epsilon);
  at::parallel_for(0, rows, grain_for(hidden), [&](int64_t b, int64_t e) {
    k.rms_norm(dt, o, orow, x, xr, w, hidden, eps, b, e, scratch_for(hidden));
  });
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual,
                        const std::optional<at::Tensor>& weight, double epsilon) {
  const int dt = dtype_code(input, "fused_add_rms_norm input");
  TORCH_CHECK(residual.sizes() == input.sizes() && residual.scalar_type() == input.scalar_type(),
              "vllm-x86 fused_add_rms_norm: residual must match input in shape and dtype");
  const int64_t hidden = input.size(-1);
  check_weight(weight, input, hidden, "fused_add_rms_norm");
  Rows2 xr = rows_of(input, "fused_add_rms_norm input");
  Rows2 rr = rows_of(residual, "fused_add_rms_norm residual");
  TORCH_CHECK(xr.n1 == 1 && rr.n1 == 1,
              "vllm-x86 fused_add_rms_norm: input and residual must be 2-D row layouts");
  const void* w = weight.has_value() ? weight->data_ptr() : nullptr;
  const auto& k = table();
  void* x = input.data_ptr();
  void* r = residual.data_ptr();
  const float eps = static_cast<float>(epsilon);
  at::parallel_for(0, xr.n0, grain_for(hidden), [&](int64_t b, int64_t e) {
    k.fused_add_rms_norm(dt, x, xr.s0, r, rr.s0, w, hidden, eps, b, e,
                         scratch_for(2 * hidden));
  });
}

void fused_add_rms_norm_f32res(at::Tensor& input, at::Tensor& residual,
                               const std::optional<at::Tensor>& weight, double epsilon) {
  const int dt = dtype_code(input, "fused_add_rms_norm_f32res input");
  TORCH_CHECK(residual.sizes() == input.sizes() && residual.scalar_type() == at::kFloat,
              "vllm-x86 fused_add_rms_norm_f32res: the residual must be float32 and have the "
              "input's shape");
  const int64_t hidden = input.size(-1);
  check_weight(weight, input, hidden, "fused_add_rms_norm_f32res");
  Rows2 xr = rows_of(input, "fused_add_rms_norm_f32res input");
  Rows2 rr = rows_of(residual, "fused_add_rms_norm_f32res residual");
  TORCH_CHECK(xr.n1 == 1 && rr.n1 == 1,
              "vllm-x86 fused_add_rms_norm_f32res: input and residual must be 2-D row layouts");
  const void* w = weight.has_value() ? weight->data_ptr() : nullptr;
  const auto& k = table();
  void* x = input.data_ptr();
  float* r = residual.data_ptr<float>();
  const float eps = static_cast<float>(epsilon);
  at::parallel_for(0, xr.n0, grain_for(hidden), [&](int64_t b, int64_t e) {
    k.fused_add_rms_norm_f32res(dt, x, xr.s0, r, rr.s0, w, hidden, eps, b, e);
  });
}

namespace {
struct HeadRows {
  int64_t row_stride;
  int heads;
};
HeadRows head_rows(const at::Tensor& t, int64_t tokens, int64_t head_size, const char* what) {
  TORCH_CHECK(t.dim() == 2 || t.dim() == 3, "vllm-x86 rotary_embedding: ", what,
              " must be [tokens, heads * head_size] or [tokens, heads, head_size]");
  TORCH_CHECK(t.size(0) == tokens, "vllm-x86 rotary_embedding: ", what,
              " has a different number of tokens than positions");
  if (t.dim() == 2) {
    TORCH_CHECK(t.stride(1) == 1 && t.size(1) % head_size == 0, "vllm-x86 rotary_embedding: ",
                what, " rows must be contiguous whole heads");
    return {t.stride(0), static_cast<int>(t.size(1) / head_size)};
  }
  TORCH_CHECK(t.size(2) == head_size && t.stride(2) == 1 && t.stride(1) == head_size,
              "vllm-x86 rotary_embedding: ", what, " heads must be contiguous");
  return {t.stride(0), static_cast<int>(t.size(1))};
}
}  // namespace

void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      const std::optional<at::Tensor>& key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox) {
  const int dt = dtype_code(query, "rotary_embedding query");
  const int cdt = dtype_code(cos_sin_cache, "rotary_embedding cos_sin_cache");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "vllm-x86 rotary_embedding: positions must be contiguous int64");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.stride(1) == 1,
              "vllm-x86 rotary_embedding: cos_sin_cache must be [max_position, rotary_dim]");
  const int64_t tokens = positions.numel();
  const int rot = static_cast<int>(cos_sin_cache.size(1));
  TORCH_CHECK(rot % 2 == 0 && rot <= head_size && rot <= 1024,
              "vllm-x86 rotary_embedding: rotary_dim must be even, <= head_size and <= 1024");
  HeadRows q = head_rows(query, tokens, head_size, "query");
  HeadRows kk{0, 0};
  void* kp = nullptr;
  if (key.has_value()) {
    TORCH_CHECK(key->scalar_type() == query.scalar_type(),
                "vllm-x86 rotary_embedding: key and query dtypes differ");
    kk = head_rows(*key, tokens, head_size, "key");
    kp = key->data_ptr();
  }
  const auto& k = table();
  const int64_t* pos = positions.data_ptr<int64_t>();
  void* qp = query.data_ptr();
  const void* cache = cos_sin_cache.data_ptr();
  const int64_t cs = cos_sin_cache.stride(0);
  const int heads = q.heads + kk.heads;
  at::parallel_for(0, tokens, grain_for(heads * rot), [&](int64_t b, int64_t e) {
    k.rotary_embedding(dt, cdt, pos, qp, q.row_stride, q.heads, kp, kk.row_stride, kk.heads,
                       static_cast<int>(head_size), rot, is_neox, cache, cs, b, e);
  });
}

namespace {
void act_and_mul(at::Tensor& out, const at::Tensor& input, int act, const char* name) {
  const int dt = dtype_code(input, name);
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), "vllm-x86 ", name,
              ": out dtype must equal input dtype");
  const int64_t d = input.size(-1) / 2;
  TORCH_CHECK(input.size(-1) == 2 * d && out.size(-1) == d && out.numel() * 2 == input.numel(),
              "vllm-x86 ", name, ": input must be [..., 2d] and out [..., d]");
  Rows2 xr = rows_of(input, name);
  Rows2 orow = rows_of(out, name);
  TORCH_CHECK(xr.n1 == 1 && orow.n1 == 1 && xr.n0 == orow.n0, "vllm-x86 ", name,
              ": input and out must be 2-D row layouts with the same rows");
  const auto& k = table();
  void* o = out.data_ptr();
  const void* x = input.data_ptr();
  at::parallel_for(0, xr.n0, grain_for(d * 4), [&](int64_t b, int64_t e) {
    k.act_and_mul(dt, act, o, orow.s0, x, xr.s0, d, b, e);
  });
}
}  // namespace

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  act_and_mul(out, input, 0, "silu_and_mul");
}
void gelu_and_mul(at::Tensor& out, const at::Tensor& input) {
  act_and_mul(out, input, 1, "gelu_and_mul");
}
void gelu_tanh_and_mul(at::Tensor& out, const at::Tensor& input) {
  act_and_mul(out, input, 2, "gelu_tanh_and_mul");
}

void split_norm_rope_neox(at::Tensor& q_out, at::Tensor& k_out, at::Tensor& v_out,
                          const at::Tensor& qkv, const at::Tensor& positions,
                          const at::Tensor& q_weight, const at::Tensor& k_weight,
                          const at::Tensor& cos_sin_cache, int64_t num_heads,
                          int64_t num_kv_heads, int64_t head_size, double epsilon) {
  const int dt = dtype_code(qkv, "split_norm_rope_neox qkv");
  const int cdt = dtype_code(cos_sin_cache, "split_norm_rope_neox cos_sin_cache");
  const int64_t tokens = positions.numel();
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "vllm-x86 split_norm_rope_neox: positions must be contiguous int64");
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && qkv.size(0) == tokens &&
                  qkv.size(1) == (num_heads + 2 * num_kv_heads) * head_size,
              "vllm-x86 split_norm_rope_neox: qkv must be [tokens, (heads + 2 kv_heads) * "
              "head_size] with contiguous rows");
  for (const at::Tensor* t : {&q_out, &k_out, &v_out}) {
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == qkv.scalar_type(),
                "vllm-x86 split_norm_rope_neox: outputs must be contiguous, in qkv's dtype");
  }
  TORCH_CHECK(q_out.numel() == tokens * num_heads * head_size &&
                  k_out.numel() == tokens * num_kv_heads * head_size &&
                  v_out.numel() == tokens * num_kv_heads * head_size,
              "vllm-x86 split_norm_rope_neox: output sizes do not match the heads");
  check_weight(q_weight, qkv, head_size, "split_norm_rope_neox q_weight");
  check_weight(k_weight, qkv, head_size, "split_norm_rope_neox k_weight");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.stride(1) == 1 &&
                  cos_sin_cache.size(1) % 2 == 0 && cos_sin_cache.size(1) <= head_size &&
                  cos_sin_cache.size(1) <= 1024,
              "vllm-x86 split_norm_rope_neox: cos_sin_cache must be [max_position, "
              "rotary_dim] with an even rotary_dim <= head_size");
  const auto& k = table();
  const int rot = static_cast<int>(cos_sin_cache.size(1));
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float eps = static_cast<float>(epsilon);
  void *qo = q_out.data_ptr(), *ko = k_out.data_ptr(), *vo = v_out.data_ptr();
  const void *x = qkv.data_ptr(), *qw = q_weight.data_ptr(), *kw = k_weight.data_ptr();
  const void* cache = cos_sin_cache.data_ptr();
  const int64_t cs = cos_sin_cache.stride(0), xs = qkv.stride(0);
  at::parallel_for(0, tokens, grain_for((num_heads + 2 * num_kv_heads) * head_size),
                   [&](int64_t b, int64_t e) {
                     k.split_norm_rope_neox(dt, cdt, qo, ko, vo, x, xs, pos, qw, kw, cache, cs,
                                            static_cast<int>(num_heads),
                                            static_cast<int>(num_kv_heads),
                                            static_cast<int>(head_size), rot, eps, b, e,
                                            scratch_for(head_size));
                   });
}

at::Tensor refine_top_logits(const at::Tensor& logits, const at::Tensor& hidden,
                             const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             double rel) {
  const char* op = "vllm-x86 refine_top_logits: ";
  const int dt = dtype_code(logits, "refine_top_logits logits");
  TORCH_CHECK(dt != kF32, op, "the logits must be bfloat16 or float16 (float32 needs no refining)");
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, op,
              "logits must be [rows, vocab] with contiguous rows");
  TORCH_CHECK(hidden.dim() == 2 && hidden.stride(1) == 1 && hidden.size(0) == logits.size(0) &&
                  hidden.scalar_type() == logits.scalar_type(), op,
              "hidden must be [rows, hidden] in the logits' dtype, a row per logits row");
  TORCH_CHECK(weight.dim() == 2 && weight.stride(1) == 1 && weight.size(0) >= logits.size(1) &&
                  weight.size(1) == hidden.size(1) && weight.scalar_type() == logits.scalar_type(),
              op, "weight must be [>= vocab, hidden] in the logits' dtype with contiguous rows");
  const void* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->is_contiguous() && bias->size(0) >= logits.size(1) &&
                    bias->scalar_type() == logits.scalar_type(), op,
                "bias must be contiguous [>= vocab] in the logits' dtype");
    bp = bias->data_ptr();
  }
  const int64_t rows = logits.size(0), V = logits.size(1), K = hidden.size(1);
  at::Tensor out = at::empty({rows, V}, logits.options().dtype(at::kFloat));
  if (rows == 0 || V == 0) return out;
  const auto& k = table();
  const void *lp = logits.data_ptr(), *hp = hidden.data_ptr(), *wp = weight.data_ptr();
  float* o = out.data_ptr<float>();
  const float r = static_cast<float>(rel);
  at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
    k.refine_logits(dt, lp, logits.stride(0), hp, hidden.stride(0), wp, weight.stride(0), bp, V,
                    K, r, o, V, b, e);
  });
  return out;
}

namespace {
// Below this many multiply-adds (tokens x query heads x head size, QK^T and PV) a decode
// attention call runs on the calling thread: a parallel region costs more than the work
// (about 10 us on one core).
constexpr int64_t kDecodeAttentionSerialWork = 1 << 18;
}  // namespace

namespace {
// Each row's key and value (rows [0, n)) into its cache slot (a negative slot: none), as
// the decode attention kernel writes them (kv_layout.h). Element-wise copies: the dtype
// is checked to be the cache's, so 2 or 4 bytes move unchanged.
template <class U>
void write_kv_rows_as(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                      const int64_t* slots, int64_t n, int64_t layout) {
  const int64_t kvh = kv_cache.size(1), bs = kv_cache.size(2), hd = kv_cache.size(3) / 2;
  U* cache = static_cast<U*>(kv_cache.data_ptr());
  const U* k = static_cast<const U*>(key.data_ptr());
  const U* v = static_cast<const U*>(value.data_ptr());
  const int lay = static_cast<int>(layout);
  for (int64_t s = 0; s < n; ++s) {
    if (slots[s] < 0) continue;
    const int64_t t = slots[s] % bs;
    for (int64_t h = 0; h < kvh; ++h) {
      U* base = cache + ((slots[s] / bs) * kvh + h) * 2 * bs * hd;
      const U* kr = k + s * key.stride(0) + h * hd;
      const U* vr = v + s * value.stride(0) + h * hd;
      for (int64_t d = 0; d < hd; ++d) {
        base[kv_key_at(lay, bs, hd, t, d)] = kr[d];
        base[kv_value_at(lay, bs, hd, t, d)] = vr[d];
      }
    }
  }
}

void write_kv_rows(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                   const int64_t* slots, int64_t n, int64_t layout) {
  if (kv_cache.element_size() == 4)
    write_kv_rows_as<uint32_t>(kv_cache, key, value, slots, n, layout);
  else
    write_kv_rows_as<uint16_t>(kv_cache, key, value, slots, n, layout);
}
}  // namespace

void decode_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key,
                      const at::Tensor& value, at::Tensor& kv_cache,
                      const at::Tensor& slot_mapping, const at::Tensor& block_table,
                      const at::Tensor& seq_lens, double scale, int64_t layout) {
  const char* op = "vllm-x86 decode_attention: ";
  const int dt = dtype_code(query, "decode_attention query");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&key, &value, &kv_cache, &out})
    TORCH_CHECK(t->scalar_type() == query.scalar_type(), op,
                "query, key, value, KV cache and output must have one dtype");
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.is_contiguous() && kv_cache.size(3) % 2 == 0, op,
              "the KV cache must be contiguous [blocks, kv_heads, block_size, 2 * head_size]");
  const int64_t kvh = kv_cache.size(1), bs = kv_cache.size(2), hd = kv_cache.size(3) / 2;
  TORCH_CHECK(hd % 16 == 0 && bs % 16 == 0, op,
              "head size and block size must be multiples of 16 (vLLM CPU's attention has "
              "them so)");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&query, &key, &value, &out})
    TORCH_CHECK(t->dim() == 2 && t->stride(1) == 1 && t->size(1) % hd == 0, op,
                "query, key, value and output must be [tokens, heads * head_size] with "
                "contiguous rows");
  TORCH_CHECK(key.size(1) == kvh * hd && value.size(1) == kvh * hd, op,
              "key and value must have the KV cache's heads");
  const int64_t heads = query.size(1) / hd;
  TORCH_CHECK(heads % kvh == 0, op, "query heads must be a multiple of KV heads");
  TORCH_CHECK(out.sizes() == query.sizes(), op, "out must have the query's shape");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.is_contiguous() &&
                  seq_lens.scalar_type() == at::kInt, op,
              "seq_lens must be contiguous int32");
  const int64_t n = seq_lens.size(0);
  TORCH_CHECK(query.size(0) >= n && key.size(0) >= n && value.size(0) >= n, op,
              "one query token per row: query, key and value need seq_lens' ", n,
              " rows");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.is_contiguous() &&
                  slot_mapping.scalar_type() == at::kLong && slot_mapping.size(0) >= n, op,
              "slot_mapping must be contiguous int64 with a slot per sequence");
  TORCH_CHECK(block_table.dim() == 2 && block_table.stride(1) == 1 &&
                  block_table.scalar_type() == at::kInt && block_table.size(0) >= n, op,
              "block_table must be int32 [sequences, blocks] with contiguous rows");
  TORCH_CHECK(layout == 0 || layout == 1, op, "layout is 0 (vec, vec16) or 1 (amx)");
  const auto& k = table();
  TORCH_CHECK(layout == 0 || (dt == kBF16 && std::string(k.name) != "avx2"), op,
              "the amx KV cache layout needs bfloat16 and the AVX-512 kernels (running: ",
              k.name, ")");
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  int64_t max_len = 0, work = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(lens[i] >= 1 && lens[i] <= block_table.size(1) * bs, op, "sequence ", i,
                " has length ", lens[i], ", outside 1..", block_table.size(1) * bs,
                " (its block table's capacity)");
    max_len = std::max<int64_t>(max_len, lens[i]);
    work += lens[i];
  }
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t blocks = kv_cache.size(0);
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(slots[i] < blocks * bs, op, "slot ", slots[i], " is outside the KV cache");
  work *= 2 * heads * hd;
  const int G = static_cast<int>(heads / kvh);
  const int64_t items = n * kvh;
  const int64_t scratch = G * (hd + max_len + 16);
  const void *q = query.data_ptr(), *kp = key.data_ptr(), *vp = value.data_ptr();
  void *cache = kv_cache.data_ptr(), *o = out.data_ptr();
  const int32_t* bt = block_table.data_ptr<int32_t>();
  const float sc = static_cast<float>(scale);
  const bool serial = items == 1 || work < kDecodeAttentionSerialWork;
  // Rows may share a sequence (the tokens of a speculative step's verification, each
  // with its own length and a copy of its sequence's block-table row; one after another):
  // a row reads the keys and values that the rows before it write. On one thread the
  // rows run in order; across threads, every row's key and value are written first (as
  // the kernel writes them) and the kernel is given no slots. Rows of distinct sequences
  // (a decode batch) keep their writes in the parallel region; two that merely look
  // alike (a first block shared through the prefix cache, consecutive lengths) only
  // take the first way.
  bool shared = false;
  const int64_t bt_s = block_table.stride(0);
  for (int64_t i = 1; i < n && !shared; ++i)
    shared = bt[i * bt_s] == bt[(i - 1) * bt_s] && lens[i] == lens[i - 1] + 1;
  std::vector<int64_t> no_slots;
  if (!serial && shared) {
    write_kv_rows(kv_cache, key, value, slots, n, layout);
    no_slots.assign(n, -1);
    slots = no_slots.data();
  }
  auto run = [&](int64_t b, int64_t e) {
    k.decode_attention(dt, static_cast<int>(layout), q, query.stride(0), kp, key.stride(0), vp,
                       value.stride(0), cache, kvh * 2 * bs * hd, static_cast<int>(kvh), bs, hd,
                       G, slots, bt, bt_s, lens, sc, o, out.stride(0), b, e,
                       scratch_for(scratch));
  };
  if (serial)
    run(0, items);
  else
    at::parallel_for(0, items, 1, run);
}

namespace {

// The W8A16/W4A16 kernel family: "amx", "avx512_vnni" or "" (none can run here).
std::string& quant_isa_choice() {
  static std::string choice;
  return choice;
}

// The best W8A16/W4A16 kernel family the library was told this CPU can run.
std::string best_quant_isa() {
  if (told("amx")) return "amx";
  if (told("avx512_vnni")) return "avx512_vnni";
  return "";
}

// VLLM_X86_QUANT_A8_ROWS's default (envs.py); kernels.py applies the setting.
int64_t& a8_rows_choice() {
  static int64_t rows = 4;
  return rows;
}

// VLLM_X86_QUANT_VNNI_ROWS's default (envs.py); kernels.py applies the setting.
int64_t& vnni_rows_choice() {
  static int64_t rows = 2;
  return rows;
}

}  // namespace

std::string quant_isa() { return quant_isa_choice(); }

int64_t quant_vnni_rows() { return vnni_rows_choice(); }

std::string int4_kernel(int64_t m) {
  // A row or two (decode of one or two requests) on an AMX CPU: the VNNI kernel reads
  // one row's INT4 weights 1.4-2.1x faster than AMX's tiles, which wait for 16 rows
  // (tools/bench/micro/quant_gemm.py; the same bits either way).
  if (quant_isa_choice() == "amx" && m <= vnni_rows_choice() && told("avx512_vnni"))
    return "avx512_vnni";
  return quant_isa_choice();
}

void set_quant_vnni_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0,
              "vllm-x86 set_quant_vnni_rows: expected 0 (never) or a row count, got ", rows);
  vnni_rows_choice() = rows;
}

int64_t quant_a8_rows() { return a8_rows_choice(); }

void set_quant_a8_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "vllm-x86 set_quant_a8_rows: expected 0 (never) or a row count, got ",
              rows);
  a8_rows_choice() = rows;
}

void set_quant_isa(const std::string& name) {
  if (name == "auto") {
    quant_isa_choice() = best_quant_isa();
    return;
  }
  TORCH_CHECK(name == "amx" || name == "avx512_vnni",
              "vllm-x86 set_quant_isa: expected auto, amx or avx512_vnni, got ", name);
  TORCH_CHECK(name != "amx" || told(name),
              "vllm-x86: the AMX kernels cannot run here (no AMX-INT8, or Linux refused the "
              "tile state; this CPU can run: ", told_list(), ")");
  TORCH_CHECK(name != "avx512_vnni" || told(name),
              "vllm-x86: the AVX-512 VNNI kernels cannot run here (this CPU has no "
              "AVX-512 VNNI; it can run: ", told_list(), ")");
  quant_isa_choice() = name;
}

std::vector<std::string> cpu_isas() { return cpu_isas_told(); }

void set_cpu_isas(const std::vector<std::string>& isas) {
  static const char* const known[] = {"avx2", "avx512", "avx512_bf16", "avx512_vnni", "amx"};
  for (const auto& name : isas) {
    bool ok = false;
    for (const char* k : known) ok = ok || name == k;
    TORCH_CHECK(ok, "vllm-x86 set_cpu_isas: unknown ISA '", name,
                "' (known: avx2, avx512, avx512_bf16, avx512_vnni, amx)");
  }
  cpu_isas_told() = isas;
  g_table = best_table();
  quant_isa_choice() = best_quant_isa();
}

namespace {

// Activations of a W8A16/W4A16 GEMM: each bf16 row of x as 16-bit integers split in two
// rows of bytes, padded with zero rows to a multiple of 16 (the A tiles read 16 rows).
struct SplitRows {
  at::Tensor a, scale;
  int64_t rows;
};

void check_activations(const at::Tensor& x, const char* op) {
  TORCH_CHECK(!quant_isa_choice().empty(), "vllm-x86 ", op,
              " needs AMX-INT8 (and Linux's permission to use it) or AVX-512 VNNI; this CPU "
              "or process has neither (the library was told it can run: ", told_list(), ")");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1,
              "vllm-x86 ", op, ": x must be a 2-D bfloat16 tensor with contiguous rows");
  TORCH_CHECK(x.size(1) % 64 == 0, "vllm-x86 ", op, ": K must be a multiple of 64, got ",
              x.size(1));
}

// Whether a GEMM of m rows takes 8-bit activations (VNNI kernels, from a8_rows rows).
bool use_a8(int64_t m) {
  return a8_rows_choice() > 0 && m >= a8_rows_choice() && quant_isa_choice() == "avx512_vnni";
}

// 8-bit activations of an A8 GEMM: int8 [m, k], a scale per 64 inputs and a sum per 32.
struct A8Rows {
  at::Tensor a, scale, sum;
};

A8Rows quant_activations_a8(const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1);
  A8Rows r;
  r.a = at::empty({m, k}, x.options().dtype(at::kChar));
  r.scale = at::empty({m, k / 64}, x.options().dtype(at::kFloat));
  r.sum = at::empty({m, k / 32}, x.options().dtype(at::kInt));
  auto* ap = r.a.data_ptr<int8_t>();
  auto* sp = r.scale.data_ptr<float>();
  auto* up = r.sum.data_ptr<int32_t>();
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const int64_t ldx = x.stride(0);
  at::parallel_for(0, m, std::max<int64_t>(1, 32768 / k), [&](int64_t b, int64_t e) {
    vnni::quant_rows_a8(xp, ldx, k, b, e, ap, sp, up);
  });
  return r;
}

// An A8 GEMM of x over nblocks channel blocks: activations rounded once, then
// gemm(a, ascale, asum, nb_begin, nb_end) on torch's threads in units of 4 blocks.
template <typename Gemm>
void run_a8(const at::Tensor& x, int64_t nblocks, const Gemm& gemm) {
  A8Rows a = quant_activations_a8(x);
  const auto* ap = a.a.data_ptr<int8_t>();
  const float* asp = a.scale.data_ptr<float>();
  const auto* aup = a.sum.data_ptr<int32_t>();
  at::parallel_for(0, (nblocks + 3) / 4, 1, [&](int64_t b, int64_t e) {
    gemm(ap, asp, aup, b * 4, std::min(e * 4, nblocks));
  });
}

SplitRows split_activations(const at::Tensor& x, const char* op) {
  check_activations(x, op);
  const int64_t m = x.size(0), k = x.size(1);
  SplitRows r;
  r.rows = (2 * m + 15) / 16 * 16;
  r.a = at::empty({r.rows, k}, x.options().dtype(at::kChar));
  r.scale = at::empty({r.rows / 2}, x.options().dtype(at::kFloat));
  auto* ap = r.a.data_ptr<int8_t>();
  // the padding rows: a memset, not a tensor op (an op dispatch per GEMM call at decode)
  if (r.rows != 2 * m) std::memset(ap + 2 * m * k, 0, (r.rows - 2 * m) * k);
  auto* sp = r.scale.data_ptr<float>();
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const int64_t ldx = x.stride(0);
  at::parallel_for(0, m, std::max<int64_t>(1, 32768 / k), [&](int64_t b, int64_t e) {
    amx::split_rows(xp, ldx, k, b, e, ap, sp);
  });
  return r;
}

const float* checked_bias(const std::optional<at::Tensor>& bias, int64_t n, const char* op) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == at::kFloat &&
                  bias->is_contiguous(),
              "vllm-x86 ", op, ": bias must be contiguous float32 [N]");
  return bias->data_ptr<float>();
}

}  // namespace

at::Tensor int8_w8a16_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                           const std::optional<at::Tensor>& bias) {
  const char* op = "int8_w8a16_gemm";
  check_activations(x, op);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar && w.is_contiguous(),
              "vllm-x86 int8_w8a16_gemm: w must be the packed int8 weight [N/16, K*16]");
  const int64_t m = x.size(0), k = x.size(1), nblocks = w.size(0), n = nblocks * 16;
  TORCH_CHECK(w.size(1) == k * 16, "vllm-x86 int8_w8a16_gemm: x has K=", k,
              " and the packed weight is ", w.sizes());
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == n && scale.scalar_type() == at::kFloat &&
                  scale.is_contiguous(),
              "vllm-x86 int8_w8a16_gemm: scale must be contiguous float32 [N]");
  const float* bp = checked_bias(bias, n, op);
  at::Tensor out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const auto* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  auto* op_ = reinterpret_cast<uint16_t*>(out.data_ptr());
  if (use_a8(m)) {
    run_a8(x, nblocks, [&](const int8_t* ap, const float* asp, const int32_t* aup, int64_t b,
                           int64_t e) {
      vnni::int8_w8a8_gemm(ap, asp, aup, m, k, wp, sp, bp, op_, n, b, e);
    });
    return out;
  }
  SplitRows a = split_activations(x, op);
  const auto* ap = a.a.data_ptr<int8_t>();
  const float* xsp = a.scale.data_ptr<float>();
  // work in units of 4 channel blocks (what one step of the kernel takes)
  const bool use_amx = quant_isa_choice() == "amx";
  at::parallel_for(0, (nblocks + 3) / 4, 1, [&](int64_t b, int64_t e) {
    if (use_amx)
      amx::int8_w8a16_gemm(ap, xsp, a.rows, m, k, wp, sp, bp, op_, n, b * 4,
                           std::min(e * 4, nblocks));
    else
      vnni::int8_w8a16_gemm(ap, xsp, m, k, wp, sp, bp, op_, n, b * 4, std::min(e * 4, nblocks));
  });
  return out;
}

at::Tensor int4_w4a16_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                           const at::Tensor& zeros, int64_t group_size,
                           const std::optional<at::Tensor>& bias) {
  const char* op = "int4_w4a16_gemm";
  check_activations(x, op);
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(group_size == 32 || group_size == 64 || group_size == 128,
              "vllm-x86 int4_w4a16_gemm: group size must be 32, 64 or 128, got ", group_size);
  TORCH_CHECK(k % group_size == 0, "vllm-x86 int4_w4a16_gemm: K=", k,
              " is not a multiple of the group size ", group_size);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() &&
                  w.size(1) == k * 8,
              "vllm-x86 int4_w4a16_gemm: w must be the packed uint8 weight [N/16, K*8] (x has "
              "K=", k, ", w is ", w.sizes(), ")");
  const int64_t nblocks = w.size(0), n = nblocks * 16, per = k / group_size * 16;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                  scale.numel() == nblocks * per,
              "vllm-x86 int4_w4a16_gemm: scale must be contiguous float32 [N/16, K/group*16]");
  TORCH_CHECK(zeros.scalar_type() == at::kByte && zeros.is_contiguous() &&
                  zeros.numel() == nblocks * per,
              "vllm-x86 int4_w4a16_gemm: zeros must be contiguous uint8 [N/16, K/group*16]");
  const float* bp = checked_bias(bias, n, op);
  at::Tensor out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const auto* wp = w.data_ptr<uint8_t>();
  const float* sp = scale.data_ptr<float>();
  const auto* zp = zeros.data_ptr<uint8_t>();
  auto* op_ = reinterpret_cast<uint16_t*>(out.data_ptr());
  if (use_a8(m)) {
    run_a8(x, nblocks, [&](const int8_t* ap, const float* asp, const int32_t* aup, int64_t b,
                           int64_t e) {
      vnni::int4_w4a8_gemm(ap, asp, aup, m, k, group_size, wp, sp, zp, bp, op_, n, b, e);
    });
    return out;
  }
  SplitRows a = split_activations(x, op);
  const auto* ap = a.a.data_ptr<int8_t>();
  const float* xsp = a.scale.data_ptr<float>();
  const bool prefill = a.rows > 32;  // more than one step of rows: expand blocks once
  if (int4_kernel(m) != "amx") {
    at::parallel_for(0, (nblocks + 3) / 4, 1, [&](int64_t b, int64_t e) {
      vnni::int4_w4a16_gemm(ap, xsp, m, k, group_size, wp, sp, zp, bp, op_, n, b * 4,
                            std::min(e * 4, nblocks));
    });
    return out;
  }
  at::parallel_for(0, (nblocks + 3) / 4, 1, [&](int64_t b, int64_t e) {
    int8_t* scratch = nullptr;
    if (prefill) {
      thread_local std::vector<int8_t> buf;
      const size_t need = static_cast<size_t>(4 * 16 * k + 64);
      if (buf.size() < need) buf.resize(need);
      auto addr = reinterpret_cast<uintptr_t>(buf.data());
      scratch = reinterpret_cast<int8_t*>((addr + 63) & ~static_cast<uintptr_t>(63));
    }
    amx::int4_w4a16_gemm(ap, xsp, a.rows, m, k, group_size, wp, sp, zp, bp, op_, n, b * 4,
                         std::min(e * 4, nblocks), scratch);
  });
  return out;
}

namespace {

// One of a decoder layer's four linear layers in decode_layer's weights list, from index
// i: the packed weight, its scale, its zero points (INT4) and its float32 bias (or
// none); group 0 is the INT8 kernel, else the INT4 kernel's group size.
at::Tensor layer_linear(const at::Tensor& x, c10::ArrayRef<std::optional<at::Tensor>> w,
                        size_t i, int64_t group) {
  TORCH_CHECK(w[i].has_value() && w[i + 1].has_value(),
              "vllm-x86 decode_layer: linear layer ", i / 4, " has no weight or scale");
  if (group == 0) return int8_w8a16_gemm(x, *w[i], *w[i + 1], w[i + 3]);
  TORCH_CHECK(w[i + 2].has_value(), "vllm-x86 decode_layer: INT4 linear layer ", i / 4,
              " has no zero points");
  return int4_w4a16_gemm(x, *w[i], *w[i + 1], *w[i + 2], group, w[i + 3]);
}

}  // namespace

// A decode step of a Llama / Qwen2 / Qwen3-style decoder layer in one call: the calls the
// plugin's eager path makes for the layer (ops/decoder_layer.py's reference runs exactly
// these ops from Python), without returning to Python between them. Inputs are never
// written: the KV cache is, by decode_attention.
//   weights: input norm, post-attention norm, then (weight, scale, zeros, bias) for
//            qkv_proj, o_proj, gate_up_proj, down_proj, then the rotary cos|sin cache in
//            the activations' dtype, then Qwen3's q_norm and k_norm weights (none for a
//            layer without q/k norms) (21 entries)
//   ints:    the four linear layers' INT4 group sizes (0: INT8), query heads, KV heads,
//            head size, neox rotary (0/1), KV cache layout (decode_attention's), float32
//            residual stream (0/1)
//   floats:  input norm epsilon, post-attention norm epsilon, attention scale, q/k norm
//            epsilon
// With q/k norms, the split of qkv, the norms and the rotary embedding are one
// split_norm_rope_neox call, as the plugin's Qwen3 attention makes it
// (ops/qwen3_attention.py); without, the rotary embedding runs in place on qkv.
// Returns (the MLP's output, the residual stream).
namespace {

// decode_layer's body on views of its lists, so that decode_stack passes each layer's
// slice of its own lists without copying them into new vectors every step.
std::tuple<at::Tensor, at::Tensor> decode_layer_impl(
    const at::Tensor& hidden, const std::optional<at::Tensor>& residual,
    const at::Tensor& positions, c10::ArrayRef<std::optional<at::Tensor>> weights,
    c10::ArrayRef<int64_t> ints, c10::ArrayRef<double> floats, const at::Tensor& kv_cache_in,
    const at::Tensor& slot_mapping, const at::Tensor& block_table, const at::Tensor& seq_lens) {
  const char* op = "vllm-x86 decode_layer: ";
  TORCH_CHECK(weights.size() == 21 && ints.size() == 10 && floats.size() == 4, op,
              "expects 21 weights, 10 ints and 4 floats (got ", weights.size(), ", ",
              ints.size(), ", ", floats.size(), ")");
  at::Tensor kv_cache = kv_cache_in;  // a handle: decode_attention writes its storage
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), op,
              "hidden must be a contiguous [tokens, hidden] tensor");
  TORCH_CHECK(weights[18].has_value(), op, "no rotary cos|sin cache");
  const int64_t nq = ints[4], nk = ints[5], hd = ints[6];
  const bool neox = ints[7] != 0, f32res = ints[9] != 0;
  const int64_t layout = ints[8];
  const double eps1 = floats[0], eps2 = floats[1], scale = floats[2];

  // input norm (layer 0 has no residual yet: the residual stream starts as its input)
  at::Tensor x, res;
  if (!residual.has_value()) {
    x = at::empty_like(hidden);
    rms_norm(x, hidden, weights[0], eps1);
    res = f32res ? hidden : hidden.clone();
  } else {
    x = hidden.clone();
    if (f32res) {
      res = residual->scalar_type() == at::kFloat ? residual->clone()
                                                  : residual->to(at::kFloat);
      fused_add_rms_norm_f32res(x, res, weights[0], eps1);
    } else {
      res = residual->clone();
      fused_add_rms_norm(x, res, weights[0], eps1);
    }
  }

  // attention: qkv, rotary of q and k in place, the KV-cache write and attention
  at::Tensor qkv = layer_linear(x, weights, 2, ints[0]);
  TORCH_CHECK(qkv.size(1) == (nq + 2 * nk) * hd, op, "qkv_proj gives ", qkv.size(1),
              " channels, not (", nq, " + 2 x ", nk, ") heads of ", hd);
  at::Tensor q, v;
  std::optional<at::Tensor> k;
  const bool qk_norm = weights[19].has_value();
  if (qk_norm) {
    TORCH_CHECK(weights[20].has_value() && neox, op,
                "q/k norms need both norm weights and a neox rotary embedding");
    q = at::empty({qkv.size(0), nq * hd}, qkv.options());
    k = at::empty({qkv.size(0), nk * hd}, qkv.options());
    v = at::empty({qkv.size(0), nk * hd}, qkv.options());
    split_norm_rope_neox(q, *k, v, qkv, positions, *weights[19], *weights[20], *weights[18],
                         nq, nk, hd, floats[3]);
  } else {
    q = qkv.narrow(1, 0, nq * hd);
    k = qkv.narrow(1, nq * hd, nk * hd);
    v = qkv.narrow(1, (nq + nk) * hd, nk * hd);
    rotary_embedding(positions, q, k, hd, *weights[18], neox);
  }
  at::Tensor attn = at::empty({hidden.size(0), nq * hd}, hidden.options());
  decode_attention(attn, q, *k, v, kv_cache, slot_mapping, block_table, seq_lens, scale, layout);
  at::Tensor o = layer_linear(attn, weights, 6, ints[1]);

  // post-attention norm, then the MLP
  if (f32res) {
    if (res.scalar_type() != at::kFloat) res = res.to(at::kFloat);
    fused_add_rms_norm_f32res(o, res, weights[1], eps2);
  } else {
    fused_add_rms_norm(o, res, weights[1], eps2);
  }
  at::Tensor gate_up = layer_linear(o, weights, 10, ints[2]);
  at::Tensor act = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  silu_and_mul(act, gate_up);
  return {layer_linear(act, weights, 14, ints[3]), res};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> decode_layer(
    const at::Tensor& hidden, const std::optional<at::Tensor>& residual,
    const at::Tensor& positions, const std::vector<std::optional<at::Tensor>>& weights,
    const std::vector<int64_t>& ints, const std::vector<double>& floats, at::Tensor& kv_cache,
    const at::Tensor& slot_mapping, const at::Tensor& block_table, const at::Tensor& seq_lens) {
  return decode_layer_impl(hidden, residual, positions, weights, ints, floats, kv_cache,
                           slot_mapping, block_table, seq_lens);
}

// A decode step of a stack of such layers, first to last, in one call: decode_layer for
// each layer in turn, the output and residual stream of one the input of the next (the
// first has no residual yet), so the results are a loop of decode_layer calls' bit for
// bit, without a return to Python and a dispatch per layer. Every layer reads the same
// slot mapping, block table and sequence lengths (one KV cache group) and its own KV
// cache; weights, ints and floats are decode_layer's, layer after layer (21, 10 and 4 a
// layer). Returns (the last layer's MLP output, the residual stream).
std::tuple<at::Tensor, at::Tensor> decode_stack(
    const at::Tensor& hidden, const at::Tensor& positions,
    const std::vector<std::optional<at::Tensor>>& weights, const std::vector<int64_t>& ints,
    const std::vector<double>& floats, at::TensorList kv_caches, const at::Tensor& slot_mapping,
    const at::Tensor& block_table, const at::Tensor& seq_lens) {
  const size_t n = kv_caches.size();
  TORCH_CHECK(n > 0 && weights.size() == 21 * n && ints.size() == 10 * n && floats.size() == 4 * n,
              "vllm-x86 decode_stack: expects 21 weights, 10 ints and 4 floats for each of the ",
              n, " layers' KV caches (got ", weights.size(), ", ", ints.size(), ", ",
              floats.size(), ")");
  const c10::ArrayRef<std::optional<at::Tensor>> w(weights);
  const c10::ArrayRef<int64_t> in(ints);
  const c10::ArrayRef<double> fl(floats);
  at::Tensor h = hidden;
  std::optional<at::Tensor> res;
  for (size_t i = 0; i < n; ++i) {
    auto out = decode_layer_impl(h, res, positions, w.slice(21 * i, 21), in.slice(10 * i, 10),
                                 fl.slice(4 * i, 4), kv_caches[i], slot_mapping, block_table,
                                 seq_lens);
    h = std::get<0>(out);
    res = std::get<1>(out);
  }
  return {h, *res};
}

std::vector<int64_t> bind_threads(const std::vector<int64_t>& cpus) {
  const int n = static_cast<int>(cpus.size());
  TORCH_CHECK(n > 0, "vllm-x86 bind_threads: no CPUs given");
  at::set_num_threads(n);
  std::vector<int64_t> got(n, -1);
  // OpenMP thread t of the team (the caller is thread 0) runs on cpus[t] alone; torch's
  // parallel regions reuse the same team
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cpus[t]), &set);
    if (sched_setaffinity(0, sizeof(set), &set) == 0) got[t] = sched_getcpu();
  }
  return got;
}

}  // namespace vllm_x86
