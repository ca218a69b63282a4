// etlab::rope.out: Llama's rotary position embedding with the heads' transpose folded in (etlab_ops.h).
#include <cstdint>

#include <executorch/runtime/core/exec_aten/util/tensor_util.h>

#include "etlab_ops.h"

namespace etlab::kernels {

using ::executorch::aten::ScalarType;
using ::executorch::aten::SizesType;
using ::executorch::runtime::Error;

namespace {

// One head's row: out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[half:], x[:half]]. Written as the
// reference computes it (a product, then the sum of two products) so that the loops vectorize and round alike.
void rotate_row(const float* x, const float* cos, const float* sin, float* out, int64_t half) {
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
  for (int64_t i = half; i < 2 * half; ++i) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

}  // namespace

Tensor& rope_out(KernelRuntimeContext& context, const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out) {
  ET_KERNEL_CHECK_MSG(context, x.dim() == 4 && cos.dim() == 3 && sin.dim() == 3, InvalidArgument, out,
                      "rope: x must be 4-D, cos and sin 3-D");
  ET_KERNEL_CHECK_MSG(context,
                      x.scalar_type() == ScalarType::Float && cos.scalar_type() == ScalarType::Float &&
                          sin.scalar_type() == ScalarType::Float,
                      InvalidArgument, out, "rope: x, cos and sin must be float32");
  const int64_t batch = x.size(0), positions = x.size(1), heads = x.size(2), width = x.size(3);
  ET_KERNEL_CHECK_MSG(context,
                      cos.size(0) == batch && cos.size(1) == positions && cos.size(2) == width &&
                          sin.size(0) == batch && sin.size(1) == positions && sin.size(2) == width,
                      InvalidArgument, out, "rope: cos and sin must be [B, S, D] for x [B, S, H, D]");
  ET_KERNEL_CHECK_MSG(context, width % 2 == 0, InvalidArgument, out, "rope: the head dim must be even");
  ET_KERNEL_CHECK_MSG(context,
                      ::executorch::runtime::tensor_is_contiguous(x) &&
                          ::executorch::runtime::tensor_is_contiguous(cos) &&
                          ::executorch::runtime::tensor_is_contiguous(sin),
                      InvalidArgument, out, "rope: tensors must be contiguous");
  const SizesType out_sizes[4] = {static_cast<SizesType>(batch), static_cast<SizesType>(heads),
                                  static_cast<SizesType>(positions), static_cast<SizesType>(width)};
  ET_KERNEL_CHECK_MSG(context, ::executorch::runtime::resize_tensor(out, {out_sizes, 4}) == Error::Ok,
                      InvalidArgument, out, "rope: out cannot hold [B, H, S, D]");
  ET_KERNEL_CHECK_MSG(context, out.scalar_type() == ScalarType::Float, InvalidArgument, out,
                      "rope: out must be float32");

  const float* source = x.const_data_ptr<float>();
  const float* cos_rows = cos.const_data_ptr<float>();
  const float* sin_rows = sin.const_data_ptr<float>();
  float* target = out.mutable_data_ptr<float>();
  // A decode step is a few heads of one position: too little to hand to the thread pool.
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < positions; ++s) {
      const int64_t table_row = (b * positions + s) * width;
      for (int64_t h = 0; h < heads; ++h) {
        rotate_row(source + ((b * positions + s) * heads + h) * width, cos_rows + table_row, sin_rows + table_row,
                   target + ((b * heads + h) * positions + s) * width, width / 2);
      }
    }
  }
  return out;
}

}  // namespace etlab::kernels
