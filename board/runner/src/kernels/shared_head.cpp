// etlab::shared_head.out: a tied language-model head computed from the quantized embedding table itself
// (etlab_ops.h; the definition and PyTorch reference: orchestrator/lowering/quantize/shared_head.py).
//
// Each input row is quantized to int8 once per call (symmetric: scale max|x| / 127, rounded to nearest even), then
// out[m, n] = scale_m * sum over groups g of scale[n, g] * (x_m . q_n) over the group, the dot products in exact
// integer arithmetic. The table is the embedding gather's own: int8 rows (8 bits) or embedding_4bit's packed rows
// (two values a byte, the even one in the high nibble, each + 8). In decode it is a memory-bound matrix-vector
// product (49152 x 576 on SmolLM2), so each table row is read once: rows are split over ExecuTorch's thread pool,
// one contiguous block per task, and a row meets every input row while it is in cache. The row loops are compiled
// for AVX-512 VNNI and AVX2 (picked at run time: u8 x s8 multiply-adds), NEON (aarch64's baseline: widening multiplies and pairwise
// adds, no dot-product extension, so a Pi 4's Cortex-A72 runs it) and plain C++ (any group size; the vector loops
// take groups of a multiple of 32 values).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include "etlab_ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ETLAB_HAVE_AVX2 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace etlab::kernels {
namespace {

// The input rows as the row loops read them, quantized once per call.
struct Quantized {
  int64_t count = 0, features = 0, groups = 0;
  std::vector<int8_t> values;     // [count, features], in order
  std::vector<int8_t> permuted;   // the same, each block of 32 as its 16 even values then its 16 odd ones (4 bits)
  std::vector<int8_t> permuted64; // each block of 64 as the odd values of its halves, then their even ones (AVX-512)
  // AVX-512: minus the table's storage offset (8 at 4 bits, 128 at 8) times each 4 consecutive values' sum, in the
  // order its loops read them: the starting value of a multiply-add's accumulator, which then holds x . q exactly.
  std::vector<int32_t> lane_offsets;
  std::vector<float> sums;        // [count, groups]: each group's sum of values (for tables stored with an offset)
  std::vector<float> scales;      // [count]
};

// One table row against every input row: out[m * stride].
using RowFunction = void (*)(const Quantized& x, const uint8_t* row, const float* scales, int64_t bits, float* out,
                             int64_t stride);

namespace portable {
inline int32_t value_at(const uint8_t* row, int64_t k, int64_t bits) {
  if (bits == 8) return static_cast<int8_t>(row[k]);
  const uint8_t byte = row[k / 2];
  return ((k & 1) ? (byte & 15) : (byte >> 4)) - 8;
}
void head_row(const Quantized& x, const uint8_t* row, const float* scales, int64_t bits, float* out, int64_t stride) {
  const int64_t group = x.features / x.groups;
  for (int64_t m = 0; m < x.count; ++m) {
    const int8_t* values = x.values.data() + m * x.features;
    float total = 0.0f;
    for (int64_t g = 0; g < x.groups; ++g) {
      int32_t sum = 0;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) sum += values[k] * value_at(row, k, bits);
      total += scales[g] * static_cast<float>(sum);
    }
    out[m * stride] = x.scales[m] * total;
  }
}
}  // namespace portable

#if defined(ETLAB_HAVE_AVX2)
namespace avx2 {
#define ETLAB_TARGET __attribute__((target("avx2,fma")))
inline ETLAB_TARGET float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}
// sum over groups of scale[g] * (the group's sum of input m's values): what a table stored with an offset
// (4 bits: + 8) adds to each group, times the offset.
inline ETLAB_TARGET float scaled_sum(const Quantized& x, int64_t m, const float* scales) {
  const float* sums = x.sums.data() + m * x.groups;
  __m256 total = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= x.groups; g += 8) total = _mm256_fmadd_ps(_mm256_loadu_ps(scales + g), _mm256_loadu_ps(sums + g), total);
  float rest = horizontal_sum(total);
  for (; g < x.groups; ++g) rest += scales[g] * sums[g];
  return rest;
}
ETLAB_TARGET void head_row(const Quantized& x, const uint8_t* row, const float* scales, int64_t bits, float* out,
                           int64_t stride) {
  const int64_t group = x.features / x.groups;
  if (group % 32 != 0) return portable::head_row(x, row, scales, bits, out, stride);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i nibble = _mm_set1_epi8(15);
  for (int64_t m = 0; m < x.count; ++m) {
    const int8_t* values = (bits == 4 ? x.permuted.data() : x.values.data()) + m * x.features;
    __m256 total = _mm256_setzero_ps();
    for (int64_t g = 0; g < x.groups; ++g) {
      __m256i acc = _mm256_setzero_si256();
      for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
        const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + k));
        __m256i products;
        if (bits == 4) {  // 16 bytes: their high nibbles (the even values), then their low ones; 0..15
          const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
          const __m256i stored = _mm256_set_m128i(_mm_and_si128(packed, nibble),
                                                  _mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
          products = _mm256_maddubs_epi16(stored, xs);
        } else {  // |w| as unsigned times x carrying w's sign: w * x, pairs summed (at most 2 * 128 * 127)
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
          products = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xs, w));
        }
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(products, ones));
      }
      total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_broadcast_ss(scales + g), total);
    }
    if (bits == 4) total = _mm256_sub_ps(total, _mm256_set_ps(0, 0, 0, 0, 0, 0, 0, 8.0f * scaled_sum(x, m, scales)));
    out[m * stride] = x.scales[m] * horizontal_sum(total);
  }
}
#undef ETLAB_TARGET
}  // namespace avx2

// Where the CPU has AVX-512 VNNI: 64 u8 x s8 products a multiply-add (vpdpbusd), two groups of 32 a register.
// Groups of 32 (in pairs) or of a multiple of 64; anything else takes the AVX2 loops.
namespace avx512 {
#define ETLAB_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))
// 64 stored values 0..15 from 32 packed bytes: the low nibbles (the odd values), then the high ones (the even
// values), the order of the input's permuted64.
inline ETLAB_TARGET __m512i unpack64(const uint8_t* bytes) {
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed), _mm256_srli_epi16(packed, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(15));
}
// 64 table values stored as unsigned: 4 bits as stored (0..15), 8 bits + 128 (w ^ 0x80).
inline ETLAB_TARGET __m512i stored64(const uint8_t* row, int64_t k, int64_t bits) {
  if (bits == 4) return unpack64(row + k / 2);
  return _mm512_xor_si512(_mm512_loadu_si512(row + k), _mm512_set1_epi8(static_cast<char>(0x80)));
}
ETLAB_TARGET void head_row(const Quantized& x, const uint8_t* row, const float* scales, int64_t bits, float* out,
                           int64_t stride) {
  const int64_t group = x.features / x.groups;
  const bool pairs = group == 32 && x.groups % 2 == 0;
  if (!pairs && group % 64 != 0) return avx2::head_row(x, row, scales, bits, out, stride);
  for (int64_t m = 0; m < x.count; ++m) {
    const int8_t* values = (bits == 4 ? x.permuted64.data() : x.values.data()) + m * x.features;
    const int32_t* offsets = x.lane_offsets.data() + m * x.features / 4;
    __m512 total = _mm512_setzero_ps();
    if (pairs) {
      // The 128-bit lanes of a 64-value block hold groups g, g + 1, g, g + 1 at 4 bits (permuted64), g, g, g + 1,
      // g + 1 at 8 (in order): each lane's 4 sums take its group's scale, the pair's two scales loaded (masked:
      // never past the row) and spread.
      const __m512i spread = bits == 4 ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                                       : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
      for (int64_t g = 0; g < x.groups; g += 2) {
        const __m512i acc = _mm512_dpbusd_epi32(_mm512_loadu_si512(offsets + g * 8), stored64(row, g * 32, bits),
                                                _mm512_loadu_si512(values + g * 32));
        const __m512 both = _mm512_permutexvar_ps(spread, _mm512_maskz_loadu_ps(0x3, scales + g));
        total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), both, total);
      }
    } else {
      for (int64_t g = 0; g < x.groups; ++g) {
        __m512i acc = _mm512_setzero_si512();
        for (int64_t k = g * group; k < (g + 1) * group; k += 64) {
          acc = _mm512_add_epi32(acc, _mm512_loadu_si512(offsets + k / 4));
          acc = _mm512_dpbusd_epi32(acc, stored64(row, k, bits), _mm512_loadu_si512(values + k));
        }
        total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(scales[g]), total);
      }
    }
    out[m * stride] = x.scales[m] * _mm512_reduce_add_ps(total);
  }
}
#undef ETLAB_TARGET
}  // namespace avx512
#endif

#if defined(__aarch64__)
namespace neon {
void head_row(const Quantized& x, const uint8_t* row, const float* scales, int64_t bits, float* out, int64_t stride) {
  const int64_t group = x.features / x.groups;
  if (group % 32 != 0) return portable::head_row(x, row, scales, bits, out, stride);
  const uint8x16_t nibble = vdupq_n_u8(15);
  const int8x16_t eight = vdupq_n_s8(8);
  for (int64_t m = 0; m < x.count; ++m) {
    const int8_t* values = (bits == 4 ? x.permuted.data() : x.values.data()) + m * x.features;
    float32x4_t total = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < x.groups; ++g) {
      int32x4_t acc = vdupq_n_s32(0);
      for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
        const int8x16_t x0 = vld1q_s8(values + k), x1 = vld1q_s8(values + k + 16);
        int8x16_t w0, w1;
        if (bits == 4) {  // the even values (high nibbles), then the odd ones, -8..7
          const uint8x16_t packed = vld1q_u8(row + k / 2);
          w0 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(packed, 4)), eight);
          w1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(packed, nibble)), eight);
        } else {
          w0 = vld1q_s8(reinterpret_cast<const int8_t*>(row + k));
          w1 = vld1q_s8(reinterpret_cast<const int8_t*>(row + k + 16));
        }
        // Two products a lane before widening: at most 2 * 128 * 127, inside int16.
        acc = vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0));
        acc = vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1));
      }
      total = vfmaq_n_f32(total, vcvtq_f32_s32(acc), scales[g]);
    }
    out[m * stride] = x.scales[m] * vaddvq_f32(total);
  }
}
}  // namespace neon
#endif

// Each row: scale = max|x| / 127 (0 for a zero row), values round(x * 127 / max|x|), nearest even, in -127..127.
void quantize_rows(const float* input, int64_t count, int64_t features, int64_t groups, int64_t bits, Quantized& x) {
  x.count = count;
  x.features = features;
  x.groups = groups;
  x.values.resize(static_cast<size_t>(count * features));
  x.permuted.resize(x.values.size());
  x.permuted64.resize(x.values.size());
  x.sums.assign(static_cast<size_t>(count * groups), 0.0f);
  x.scales.resize(static_cast<size_t>(count));
  const int64_t group = features / groups;
  for (int64_t m = 0; m < count; ++m) {
    const float* row = input + m * features;
    float largest = 0.0f;
    for (int64_t k = 0; k < features; ++k) largest = std::max(largest, std::fabs(row[k]));
    const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
    x.scales[m] = largest / 127.0f;
    int8_t* values = x.values.data() + m * features;
    for (int64_t k = 0; k < features; ++k) {
      const float scaled = std::nearbyint(row[k] * inverse);
      values[k] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, scaled)));
      x.sums[m * groups + k / group] += values[k];  // exact: at most 127 * features
    }
    int8_t* permuted = x.permuted.data() + m * features;
    for (int64_t block = 0; block + 32 <= features; block += 32) {
      for (int64_t i = 0; i < 16; ++i) {
        permuted[block + i] = values[block + 2 * i];
        permuted[block + 16 + i] = values[block + 2 * i + 1];
      }
    }
    int8_t* permuted64 = x.permuted64.data() + m * features;
    for (int64_t block = 0; block + 64 <= features; block += 64) {
      for (int64_t i = 0; i < 32; ++i) {  // byte i of the block's 32: values 2i (high nibble) and 2i + 1 (low)
        permuted64[block + i] = values[block + 2 * i + 1];
        permuted64[block + 32 + i] = values[block + 2 * i];
      }
    }
  }
  x.lane_offsets.assign(static_cast<size_t>(count * features / 4), 0);
  const int8_t* order = bits == 4 ? x.permuted64.data() : x.values.data();
  const int32_t offset = bits == 4 ? 8 : 128;
  for (int64_t i = 0; i + 4 <= count * features; i += 4) {
    x.lane_offsets[i / 4] = -offset * (order[i] + order[i + 1] + order[i + 2] + order[i + 3]);
  }
}

struct Isa {
  const char* name;
  RowFunction row;
};

#if defined(ETLAB_HAVE_AVX2)
bool has_avx512_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

Isa best_isa() {
#if defined(ETLAB_HAVE_AVX2)
  if (has_avx512_vnni()) return {"avx512vnni", avx512::head_row};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"avx2", avx2::head_row};
#endif
#if defined(__aarch64__)
  return {"neon", neon::head_row};
#else
  return {"portable", portable::head_row};
#endif
}

Isa& current_isa() {
  static Isa isa = best_isa();
  return isa;
}

// Below this many table bytes a call runs on the caller's thread: the pool's wake-up would cost more.
constexpr int64_t kParallelBytes = 64 * 1024;

}  // namespace

const char* shared_head_isa() { return current_isa().name; }

bool force_shared_head_isa(const char* name) {
  const std::string wanted(name);
  if (wanted == "portable") {
    current_isa() = {"portable", portable::head_row};
    return true;
  }
#if defined(ETLAB_HAVE_AVX2)
  if (wanted == "avx2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    current_isa() = {"avx2", avx2::head_row};
    return true;
  }
  if (wanted == "avx512vnni" && has_avx512_vnni()) {
    current_isa() = {"avx512vnni", avx512::head_row};
    return true;
  }
#endif
#if defined(__aarch64__)
  if (wanted == "neon") {
    current_isa() = {"neon", neon::head_row};
    return true;
  }
#endif
  return false;
}

using ::executorch::aten::ScalarType;
using ::executorch::aten::SizesType;
using ::executorch::runtime::Error;
using ::executorch::runtime::tensor_is_contiguous;

Tensor& shared_head_out(KernelRuntimeContext& context, const Tensor& input, const Tensor& table, const Tensor& scales,
                        int64_t bits, Tensor& out) {
  ET_KERNEL_CHECK_MSG(context, bits == 8 || bits == 4, InvalidArgument, out, "shared_head: bits must be 8 or 4");
  ET_KERNEL_CHECK_MSG(context, table.dim() == 2 && input.dim() >= 1 && input.dim() <= 8, InvalidArgument, out,
                      "shared_head: the table must be 2-D, the input 1-D to 8-D");
  const ScalarType wanted = bits == 8 ? ScalarType::Char : ScalarType::Byte;
  ET_KERNEL_CHECK_MSG(context, table.scalar_type() == wanted, InvalidArgument, out,
                      "shared_head: a %d-bit table must be %s", static_cast<int>(bits),
                      bits == 8 ? "int8" : "uint8 (packed)");
  ET_KERNEL_CHECK_MSG(context,
                      input.scalar_type() == ScalarType::Float && scales.scalar_type() == ScalarType::Float &&
                          out.scalar_type() == ScalarType::Float,
                      InvalidArgument, out, "shared_head: input, scales and out must be float32");
  const int64_t rows = table.size(0), features = table.size(1) * (8 / bits);
  ET_KERNEL_CHECK_MSG(context, input.size(input.dim() - 1) == features, InvalidArgument, out,
                      "shared_head: the input's %lld features are not the table's %lld",
                      static_cast<long long>(input.size(input.dim() - 1)), static_cast<long long>(features));
  ET_KERNEL_CHECK_MSG(context, (scales.dim() == 1 || scales.dim() == 2) && scales.size(0) == rows, InvalidArgument,
                      out, "shared_head: scales must be [N] or [N, G] for the table's N rows");
  const int64_t groups = scales.dim() == 2 ? scales.size(1) : 1;
  ET_KERNEL_CHECK_MSG(context, groups >= 1 && features % groups == 0, InvalidArgument, out,
                      "shared_head: %lld groups do not divide %lld features", static_cast<long long>(groups),
                      static_cast<long long>(features));
  SizesType sizes[8];
  for (int64_t d = 0; d + 1 < input.dim(); ++d) sizes[d] = static_cast<SizesType>(input.size(d));
  sizes[input.dim() - 1] = static_cast<SizesType>(rows);
  ET_KERNEL_CHECK_MSG(context,
                      ::executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(input.dim())}) == Error::Ok,
                      InvalidArgument, out, "shared_head: out cannot take the shape [..., N]");
  ET_KERNEL_CHECK_MSG(context,
                      tensor_is_contiguous(input) && tensor_is_contiguous(table) && tensor_is_contiguous(scales) &&
                          tensor_is_contiguous(out),
                      InvalidArgument, out, "shared_head: tensors must be contiguous");

  const int64_t count = features > 0 ? input.numel() / features : 0;
  const int64_t row_bytes = table.size(1);
  const auto* bytes = static_cast<const uint8_t*>(table.const_data_ptr());
  const float* scale = scales.const_data_ptr<float>();
  float* y = out.mutable_data_ptr<float>();
  if (features == 0) {
    if (out.nbytes() > 0) std::memset(y, 0, out.nbytes());
    return out;
  }
  Quantized x;
  quantize_rows(input.const_data_ptr<float>(), count, features, groups, bits, x);
  const RowFunction row_function = current_isa().row;
  auto run_rows = [&](int64_t first, int64_t end) {
    for (int64_t n = first; n < end; ++n) row_function(x, bytes + n * row_bytes, scale + n * groups, bits, y + n, rows);
  };
  const int64_t tasks = std::min<int64_t>(::executorch::extension::get_thread_count(), rows);
  if (tasks <= 1 || rows * row_bytes < kParallelBytes) {
    run_rows(0, rows);
    return out;
  }
  // One contiguous block of rows per task: each task streams its part of the table once.
  const int64_t block = (rows + tasks - 1) / tasks;
  const bool done = ::executorch::extension::parallel_for(0, tasks, 1, [&](int64_t first, int64_t end) {
    for (int64_t task = first; task < end; ++task) run_rows(task * block, std::min(rows, (task + 1) * block));
  });
  ET_KERNEL_CHECK_MSG(context, done, Internal, out, "shared_head: the thread pool refused the work");
  return out;
}

}  // namespace etlab::kernels
