// etlab's attention and KV-cache operators, the runner's side (the export side, schemas and the PyTorch reference
// that defines them: orchestrator/lowering/attention/ops.py). register.cpp registers both as out variants:
//   etlab::update_cache.out(Tensor value, Tensor(a!) cache, Tensor positions, *, Tensor(b!) out) -> Tensor(b!)
//   etlab::attend.out(Tensor query, Tensor key_cache, Tensor value_cache, Tensor positions, float scale, *,
//                     Tensor(a!) out) -> Tensor(a!)
//   etlab::rope.out(Tensor x, Tensor cos, Tensor sin, *, Tensor(a!) out) -> Tensor(a!)
//   etlab::rms_norm.out(Tensor x, Tensor weight, float eps, *, Tensor(a!) out) -> Tensor(a!)
//   etlab::shared_head.out(Tensor input, Tensor table, Tensor scales, int bits, *, Tensor(a!) out) -> Tensor(a!)
//     (its definition: orchestrator/lowering/quantize/shared_head.py)
// A bad shape, dtype, layout or position fails the kernel (InvalidArgument) before anything is written.
#pragma once

#include <cstddef>
#include <cstdint>

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>

namespace etlab::kernels {

using ::executorch::aten::Tensor;
using ::executorch::runtime::KernelRuntimeContext;

// cache[b, h, positions[i], :] = value[b, h, i, :]: only the S new rows are written, in place; out = [0].
Tensor& update_cache_out(KernelRuntimeContext& context, const Tensor& value, Tensor& cache, const Tensor& positions,
                         Tensor& out);

// Query row i of head h attends to rows 0..positions[i] of KV head h / (Hq / Hkv), softmax(q . k * scale) . v.
Tensor& attend_out(KernelRuntimeContext& context, const Tensor& query, const Tensor& key_cache,
                   const Tensor& value_cache, const Tensor& positions, double scale, Tensor& out);

// Llama's RoPE with the heads' transpose folded in: x [B, S, H, D] (as the projection wrote it), cos and sin
// [B, S, D]; out[b, h, s] = x[b, s, h] * cos[b, s] + rotate_half(x[b, s, h]) * sin[b, s], float32.
Tensor& rope_out(KernelRuntimeContext& context, const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out);

// Llama's RMSNorm over the last dim: out[..., i] = weight[i] * (x[..., i] * rsqrt(mean(x[...]^2) + eps)), float32.
Tensor& rms_norm_out(KernelRuntimeContext& context, const Tensor& x, const Tensor& weight, double eps, Tensor& out);

// A tied head over the embedding's quantized table: out[..., n] = input[..., :] . dequantize(table[n]), the table
// int8 rows (bits 8) or embedding_4bit's packed rows (bits 4), scales [N] or [N, G] (G groups a row).
Tensor& shared_head_out(KernelRuntimeContext& context, const Tensor& input, const Tensor& table, const Tensor& scales,
                        int64_t bits, Tensor& out);

// The instruction set attend's inner loops use here: "avx2" (x86-64 with AVX2 and FMA), "neon" (aarch64) or
// "portable". force_attend_isa picks one for the kernel check (false when this CPU or build lacks it).
const char* attend_isa();
bool force_attend_isa(const char* name);
// The same for shared_head's row loops.
const char* shared_head_isa();
bool force_shared_head_isa(const char* name);

// For the kernel check: while recording, attend notes which threads ran its tasks; the count of distinct ones
// since recording started (proof that the heads ran in parallel, not serially).
void record_attend_threads(bool on);
size_t attend_thread_count();

}  // namespace etlab::kernels
