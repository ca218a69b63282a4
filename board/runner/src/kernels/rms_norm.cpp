// etlab::rms_norm.out: Llama's RMSNorm over each row of the last dim, in one call (etlab_ops.h).
#include <cmath>
#include <cstdint>

#include <executorch/runtime/core/exec_aten/util/tensor_util.h>

#include "etlab_ops.h"

namespace etlab::kernels {

using ::executorch::aten::ScalarType;
using ::executorch::runtime::Error;

namespace {

// Independent partial sums, so the compiler vectorizes the squares' sum without reassociating one chain.
constexpr int64_t kLanes = 16;

float mean_of_squares(const float* row, int64_t width) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= width; i += kLanes) {
    for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane] += row[i + lane] * row[i + lane];
  }
  float sum = 0.0f;
  for (; i < width; ++i) sum += row[i] * row[i];
  for (int64_t lane = 0; lane < kLanes; ++lane) sum += lanes[lane];
  return sum / static_cast<float>(width);
}

}  // namespace

Tensor& rms_norm_out(KernelRuntimeContext& context, const Tensor& x, const Tensor& weight, double eps, Tensor& out) {
  ET_KERNEL_CHECK_MSG(context, x.dim() >= 1 && weight.dim() == 1, InvalidArgument, out,
                      "rms_norm: x must have a dim, weight must be 1-D");
  ET_KERNEL_CHECK_MSG(context, x.scalar_type() == ScalarType::Float && weight.scalar_type() == ScalarType::Float,
                      InvalidArgument, out, "rms_norm: x and weight must be float32");
  const int64_t width = x.size(x.dim() - 1);
  ET_KERNEL_CHECK_MSG(context, weight.size(0) == width && width > 0, InvalidArgument, out,
                      "rms_norm: weight must be as wide as x's rows");
  ET_KERNEL_CHECK_MSG(context, std::isfinite(eps) && eps >= 0.0, InvalidArgument, out,
                      "rms_norm: eps must be finite and not negative");
  ET_KERNEL_CHECK_MSG(context,
                      ::executorch::runtime::tensor_is_contiguous(x) &&
                          ::executorch::runtime::tensor_is_contiguous(weight),
                      InvalidArgument, out, "rms_norm: tensors must be contiguous");
  ET_KERNEL_CHECK_MSG(context, ::executorch::runtime::resize_tensor(out, x.sizes()) == Error::Ok, InvalidArgument,
                      out, "rms_norm: out cannot hold x's shape");
  ET_KERNEL_CHECK_MSG(context, out.scalar_type() == ScalarType::Float, InvalidArgument, out,
                      "rms_norm: out must be float32");

  const float* source = x.const_data_ptr<float>();
  const float* scale = weight.const_data_ptr<float>();
  float* target = out.mutable_data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  // A decode step normalizes one row of a few hundred values: too little to hand to the thread pool.
  const int64_t rows = x.numel() / width;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = source + r * width;
    float* normed = target + r * width;
    // As the reference rounds: x * rsqrt(mean + eps) first, then the weight's product.
    const float inverse = 1.0f / std::sqrt(mean_of_squares(row, width) + epsilon);
    for (int64_t i = 0; i < width; ++i) normed[i] = scale[i] * (row[i] * inverse);
  }
  return out;
}

}  // namespace etlab::kernels
