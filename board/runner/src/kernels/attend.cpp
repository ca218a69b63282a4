// etlab::attend.out: causal attention by position over the filled cache rows (etlab_ops.h).
//
// Work items are (batch, query head, query row); each reads only rows 0..positions[i] of its KV head (query head h
// shares KV head h / group by index, nothing is copied). Items run on ExecuTorch's thread pool: a prompt's as one
// task per thread taking every T-th item, so its long and short causal rows spread evenly over the threads; a
// decode step's (one row) in contiguous runs of heads, so a group's heads share their KV head's rows in one cache. The
// inner loops (q . k, the weighted sum of v rows) are attend_row.inc, compiled for AVX2+FMA (picked at run time),
// NEON (aarch64's baseline: fused multiply-add, no dot-product extension) and plain C++.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
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

namespace portable {
#define ETLAB_TARGET
static inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}
static inline void dots(const float* q, const float* keys, int64_t count, int64_t n, float a, float* scores) {
  for (int64_t j = 0; j < count; ++j) scores[j] = dot(q, keys + j * n, n) * a;
}
static inline void weigh(float* y, const float* w, const float* x, int64_t count, int64_t n) {
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t i = 0; i < n; ++i) y[i] += w[j] * x[j * n + i];
  }
}
static inline void scale(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}
static inline void exp_all(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(y[i]);
}
#include "attend_row.inc"
#undef ETLAB_TARGET
}  // namespace portable

#if defined(ETLAB_HAVE_AVX2)
namespace avx2 {
#define ETLAB_TARGET __attribute__((target("avx2,fma")))
static inline ETLAB_TARGET float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}
static inline ETLAB_TARGET float dot(const float* a, const float* b, int64_t n) {
  __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    sum0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), sum0);
    sum1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), sum1);
  }
  if (i + 8 <= n) {
    sum0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), sum0);
    i += 8;
  }
  float sum = horizontal_sum(_mm256_add_ps(sum0, sum1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}
// Eight keys at a time: eight independent sums (the FMA latency hidden), reduced together by one hadd tree, so a
// key costs a few cycles instead of a dependent chain and a horizontal sum of its own. Row lengths that are not a
// multiple of 8, and the last keys of a block, take dot().
static inline ETLAB_TARGET void dots(const float* q, const float* keys, int64_t count, int64_t n, float a,
                                     float* scores) {
  int64_t j = 0;
  if (n % 8 == 0) {
    const __m256 factor = _mm256_set1_ps(a);
    for (; j + 8 <= count; j += 8) {
      const float* k = keys + j * n;
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
      __m256 s4 = _mm256_setzero_ps(), s5 = _mm256_setzero_ps(), s6 = _mm256_setzero_ps(), s7 = _mm256_setzero_ps();
      for (int64_t i = 0; i < n; i += 8) {
        const __m256 x = _mm256_loadu_ps(q + i);
        s0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + i), s0);
        s1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + n + i), s1);
        s2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 2 * n + i), s2);
        s3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 3 * n + i), s3);
        s4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 4 * n + i), s4);
        s5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 5 * n + i), s5);
        s6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 6 * n + i), s6);
        s7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 7 * n + i), s7);
      }
      // hadd works within 128-bit lanes: after two rounds, the low lane holds keys 0-3's (or 4-7's) first halves
      // and the high lane their second halves.
      const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
      const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(s4, s5), _mm256_hadd_ps(s6, s7));
      const __m256 sums =
          _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
      _mm256_storeu_ps(scores + j, _mm256_mul_ps(sums, factor));
    }
  }
  for (; j < count; ++j) scores[j] = dot(q, keys + j * n, n) * a;
}
// Column slices of 32 (then 8) floats stay in registers across all `count` rows: y is loaded and stored once per
// block of rows, not once per row.
static inline ETLAB_TARGET void weigh(float* y, const float* w, const float* x, int64_t count, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);
    __m256 y2 = _mm256_loadu_ps(y + i + 16), y3 = _mm256_loadu_ps(y + i + 24);
    for (int64_t j = 0; j < count; ++j) {
      const __m256 weight = _mm256_set1_ps(w[j]);
      const float* row = x + j * n + i;
      y0 = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row), y0);
      y1 = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 8), y1);
      y2 = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 16), y2);
      y3 = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 24), y3);
    }
    _mm256_storeu_ps(y + i, y0);
    _mm256_storeu_ps(y + i + 8, y1);
    _mm256_storeu_ps(y + i + 16, y2);
    _mm256_storeu_ps(y + i + 24, y3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 y0 = _mm256_loadu_ps(y + i);
    for (int64_t j = 0; j < count; ++j) y0 = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps(x + j * n + i), y0);
    _mm256_storeu_ps(y + i, y0);
  }
  for (; i < n; ++i) {
    float sum = y[i];
    for (int64_t j = 0; j < count; ++j) sum += w[j] * x[j * n + i];
    y[i] = sum;
  }
}
static inline ETLAB_TARGET void scale(float* y, float a, int64_t n) {
  const __m256 factor = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(factor, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= a;
}
// exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2] (ln 2 split in two for precision),
// exp(r) = 1 + r + r^2 P(r) with Cephes' degree-5 P. Inputs below -87.3 (where float's exp underflows) give 0.
static inline ETLAB_TARGET __m256 exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  x = _mm256_max_ps(lowest, x);  // the second operand on NaN: a NaN stays NaN
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(exponent)));
}
static inline ETLAB_TARGET void exp_all(float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(y + i)));
  if (i < n) {  // the tail through the same formula, so every weight is computed alike
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(tail, y + i, sizeof(float) * static_cast<size_t>(n - i));
    _mm256_storeu_ps(tail, exp8(_mm256_loadu_ps(tail)));
    std::memcpy(y + i, tail, sizeof(float) * static_cast<size_t>(n - i));
  }
}
#include "attend_row.inc"
#undef ETLAB_TARGET
}  // namespace avx2
#endif

#if defined(__aarch64__)
namespace neon {
#define ETLAB_TARGET
static inline float dot(const float* a, const float* b, int64_t n) {
  float32x4_t sum0 = vdupq_n_f32(0.0f), sum1 = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    sum0 = vfmaq_f32(sum0, vld1q_f32(a + i), vld1q_f32(b + i));
    sum1 = vfmaq_f32(sum1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
  }
  if (i + 4 <= n) {
    sum0 = vfmaq_f32(sum0, vld1q_f32(a + i), vld1q_f32(b + i));
    i += 4;
  }
  float sum = vaddvq_f32(vaddq_f32(sum0, sum1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}
// As AVX2's dots: four keys at a time, reduced together by pairwise adds.
static inline void dots(const float* q, const float* keys, int64_t count, int64_t n, float a, float* scores) {
  int64_t j = 0;
  if (n % 4 == 0) {
    for (; j + 4 <= count; j += 4) {
      const float* k = keys + j * n;
      float32x4_t s0 = vdupq_n_f32(0.0f), s1 = vdupq_n_f32(0.0f), s2 = vdupq_n_f32(0.0f), s3 = vdupq_n_f32(0.0f);
      for (int64_t i = 0; i < n; i += 4) {
        const float32x4_t x = vld1q_f32(q + i);
        s0 = vfmaq_f32(s0, x, vld1q_f32(k + i));
        s1 = vfmaq_f32(s1, x, vld1q_f32(k + n + i));
        s2 = vfmaq_f32(s2, x, vld1q_f32(k + 2 * n + i));
        s3 = vfmaq_f32(s3, x, vld1q_f32(k + 3 * n + i));
      }
      vst1q_f32(scores + j, vmulq_n_f32(vpaddq_f32(vpaddq_f32(s0, s1), vpaddq_f32(s2, s3)), a));
    }
  }
  for (; j < count; ++j) scores[j] = dot(q, keys + j * n, n) * a;
}
// As AVX2's weigh: column slices of 16 (then 4) floats in registers across the rows.
static inline void weigh(float* y, const float* w, const float* x, int64_t count, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    float32x4_t y0 = vld1q_f32(y + i), y1 = vld1q_f32(y + i + 4), y2 = vld1q_f32(y + i + 8), y3 = vld1q_f32(y + i + 12);
    for (int64_t j = 0; j < count; ++j) {
      const float* row = x + j * n + i;
      y0 = vfmaq_n_f32(y0, vld1q_f32(row), w[j]);
      y1 = vfmaq_n_f32(y1, vld1q_f32(row + 4), w[j]);
      y2 = vfmaq_n_f32(y2, vld1q_f32(row + 8), w[j]);
      y3 = vfmaq_n_f32(y3, vld1q_f32(row + 12), w[j]);
    }
    vst1q_f32(y + i, y0);
    vst1q_f32(y + i + 4, y1);
    vst1q_f32(y + i + 8, y2);
    vst1q_f32(y + i + 12, y3);
  }
  for (; i + 4 <= n; i += 4) {
    float32x4_t y0 = vld1q_f32(y + i);
    for (int64_t j = 0; j < count; ++j) y0 = vfmaq_n_f32(y0, vld1q_f32(x + j * n + i), w[j]);
    vst1q_f32(y + i, y0);
  }
  for (; i < n; ++i) {
    float sum = y[i];
    for (int64_t j = 0; j < count; ++j) sum += w[j] * x[j * n + i];
    y[i] = sum;
  }
}
static inline void scale(float* y, float a, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(y + i), a));
  for (; i < n; ++i) y[i] *= a;
}
// The same exponential as AVX2's exp8 (see there), four lanes at a time.
static inline float32x4_t exp4(float32x4_t x) {
  const float32x4_t lowest = vdupq_n_f32(-87.33654f);
  const uint32x4_t underflow = vcltq_f32(x, lowest);
  x = vmaxq_f32(x, lowest);  // NaN in, NaN out
  const float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, k, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  const float32x4_t y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
  const int32x4_t exponent = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
  return vbslq_f32(underflow, vdupq_n_f32(0.0f), vmulq_f32(y, vreinterpretq_f32_s32(exponent)));
}
static inline void exp_all(float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, exp4(vld1q_f32(y + i)));
  if (i < n) {
    float tail[4] = {0, 0, 0, 0};
    std::memcpy(tail, y + i, sizeof(float) * static_cast<size_t>(n - i));
    vst1q_f32(tail, exp4(vld1q_f32(tail)));
    std::memcpy(y + i, tail, sizeof(float) * static_cast<size_t>(n - i));
  }
}
#include "attend_row.inc"
#undef ETLAB_TARGET
}  // namespace neon
#endif

using RowFunction = void (*)(const float*, const float*, const float*, int64_t, int64_t, float, float*);

struct Isa {
  const char* name;
  RowFunction row;
};

Isa best_isa() {
#if defined(ETLAB_HAVE_AVX2)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"avx2", avx2::attend_row};
#endif
#if defined(__aarch64__)
  return {"neon", neon::attend_row};
#else
  return {"portable", portable::attend_row};
#endif
}

Isa& current_isa() {
  static Isa isa = best_isa();
  return isa;
}

// Below this many multiply-adds per call the pool's wake-up costs more than it saves.
constexpr int64_t kParallelWork = 16384;

std::atomic<bool> recording{false};
std::mutex recorded_mutex;
std::vector<std::thread::id> recorded_threads;

void note_thread() {
  if (!recording.load(std::memory_order_relaxed)) return;
  const std::lock_guard<std::mutex> lock(recorded_mutex);
  const auto id = std::this_thread::get_id();
  if (std::find(recorded_threads.begin(), recorded_threads.end(), id) == recorded_threads.end()) {
    recorded_threads.push_back(id);
  }
}

}  // namespace

const char* attend_isa() { return current_isa().name; }

bool force_attend_isa(const char* name) {
  const std::string wanted(name);
  if (wanted == "portable") {
    current_isa() = {"portable", portable::attend_row};
    return true;
  }
#if defined(ETLAB_HAVE_AVX2)
  if (wanted == "avx2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    current_isa() = {"avx2", avx2::attend_row};
    return true;
  }
#endif
#if defined(__aarch64__)
  if (wanted == "neon") {
    current_isa() = {"neon", neon::attend_row};
    return true;
  }
#endif
  return false;
}

void record_attend_threads(bool on) {
  const std::lock_guard<std::mutex> lock(recorded_mutex);
  recorded_threads.clear();
  recording.store(on);
}

size_t attend_thread_count() {
  const std::lock_guard<std::mutex> lock(recorded_mutex);
  return recorded_threads.size();
}

using ::executorch::aten::ScalarType;
using ::executorch::runtime::Error;
using ::executorch::runtime::tensor_is_contiguous;

Tensor& attend_out(KernelRuntimeContext& context, const Tensor& query, const Tensor& key_cache,
                   const Tensor& value_cache, const Tensor& positions, double scale, Tensor& out) {
  ET_KERNEL_CHECK_MSG(context, query.dim() == 4 && key_cache.dim() == 4 && value_cache.dim() == 4, InvalidArgument,
                      out, "attend: query and caches must be 4-D");
  ET_KERNEL_CHECK_MSG(context,
                      query.scalar_type() == ScalarType::Float && key_cache.scalar_type() == ScalarType::Float &&
                          value_cache.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float,
                      InvalidArgument, out, "attend: query, caches and out must be float32");
  ET_KERNEL_CHECK_MSG(context, positions.dim() == 1 && positions.scalar_type() == ScalarType::Long, InvalidArgument,
                      out, "attend: positions must be a 1-D int64 tensor");
  const int64_t batch = query.size(0), query_heads = query.size(1), rows = query.size(2), dim = query.size(3);
  const int64_t kv_heads = key_cache.size(1), capacity = key_cache.size(2);
  bool same_caches = true;
  for (int64_t d = 0; d < 4; ++d) same_caches = same_caches && key_cache.size(d) == value_cache.size(d);
  ET_KERNEL_CHECK_MSG(context, same_caches, InvalidArgument, out, "attend: key and value caches differ in shape");
  ET_KERNEL_CHECK_MSG(context,
                      key_cache.size(0) == batch && kv_heads > 0 && query_heads % kv_heads == 0 &&
                          key_cache.size(3) == dim && positions.size(0) == rows,
                      InvalidArgument, out,
                      "attend: query [B, Hq, S, D] does not fit caches [B, Hkv, C, D] and positions [S]");
  ET_KERNEL_CHECK_MSG(context, ::executorch::runtime::resize_tensor(out, query.sizes()) == Error::Ok,
                      InvalidArgument, out, "attend: out cannot take the query's shape");
  ET_KERNEL_CHECK_MSG(context,
                      tensor_is_contiguous(query) && tensor_is_contiguous(key_cache) &&
                          tensor_is_contiguous(value_cache) && tensor_is_contiguous(positions) &&
                          tensor_is_contiguous(out),
                      InvalidArgument, out, "attend: tensors must be contiguous");
  const int64_t* position = positions.const_data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i < rows; ++i) {
    ET_KERNEL_CHECK_MSG(context, position[i] >= 0 && position[i] < capacity, InvalidArgument, out,
                        "attend: position %lld is outside the cache's %lld rows",
                        static_cast<long long>(position[i]), static_cast<long long>(capacity));
    longest = std::max(longest, position[i] + 1);
  }

  const float* queries = query.const_data_ptr<float>();
  const float* keys = key_cache.const_data_ptr<float>();
  const float* values = value_cache.const_data_ptr<float>();
  float* outputs = out.mutable_data_ptr<float>();
  const int64_t group = query_heads / kv_heads;
  const int64_t items = batch * query_heads * rows;
  const float score_scale = static_cast<float>(scale);
  const RowFunction row_function = current_isa().row;
  // Item t is (b, h, i) with t = (b * Hq + h) * S + i.
  auto run_item = [&](int64_t item) {
    const int64_t i = item % rows, head = item / rows;  // head = b * Hq + h
    const int64_t b = head / query_heads, h = head % query_heads;
    const int64_t kv_plane = (b * kv_heads + h / group) * capacity * dim;
    row_function(queries + item * dim, keys + kv_plane, values + kv_plane, position[i] + 1, dim, score_scale,
                 outputs + item * dim);
  };
  const int64_t tasks = std::min<int64_t>(::executorch::extension::get_thread_count(), items);
  if (tasks <= 1 || items * longest * dim < kParallelWork) {
    for (int64_t item = 0; item < items; ++item) run_item(item);
    return out;
  }
  // A decode step (one row): every item costs the same, so the pool splits the items into contiguous runs of heads;
  // a KV head's rows are then read from memory by one core, and its group's other heads find them in that core's
  // cache. A prompt: one task per thread taking every T-th item.
  const bool decode = rows == 1;
  const int64_t ranges = decode ? items : tasks;
  const bool done = ::executorch::extension::parallel_for(0, ranges, 1, [&](int64_t first, int64_t end) {
    note_thread();
    for (int64_t task = first; task < end; ++task) {
      if (decode) {
        run_item(task);
      } else {
        for (int64_t item = task; item < items; item += tasks) run_item(item);
      }
    }
  });
  ET_KERNEL_CHECK_MSG(context, done, Internal, out, "attend: the thread pool refused the work");
  return out;
}

}  // namespace etlab::kernels
