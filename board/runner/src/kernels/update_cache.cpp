// etlab::update_cache.out: the new rows written into the cache in place (etlab_ops.h).
#include <cstdint>
#include <cstring>

#include <executorch/runtime/core/exec_aten/util/tensor_util.h>

#include "etlab_ops.h"

namespace etlab::kernels {

using ::executorch::aten::ScalarType;
using ::executorch::aten::SizesType;
using ::executorch::runtime::Error;

Tensor& update_cache_out(KernelRuntimeContext& context, const Tensor& value, Tensor& cache, const Tensor& positions,
                         Tensor& out) {
  ET_KERNEL_CHECK_MSG(context, value.dim() == 4 && cache.dim() == 4, InvalidArgument, out,
                      "update_cache: value and cache must be 4-D");
  ET_KERNEL_CHECK_MSG(context, positions.dim() == 1 && positions.scalar_type() == ScalarType::Long, InvalidArgument,
                      out, "update_cache: positions must be a 1-D int64 tensor");
  ET_KERNEL_CHECK_MSG(context, value.scalar_type() == cache.scalar_type(), InvalidArgument, out,
                      "update_cache: value and cache dtypes differ");
  ET_KERNEL_CHECK_MSG(context,
                      value.size(0) == cache.size(0) && value.size(1) == cache.size(1) &&
                          value.size(3) == cache.size(3) && value.size(2) == positions.size(0),
                      InvalidArgument, out, "update_cache: value [B, H, S, D] does not fit cache [B, H, C, D]");
  ET_KERNEL_CHECK_MSG(context,
                      ::executorch::runtime::tensor_is_contiguous(value) &&
                          ::executorch::runtime::tensor_is_contiguous(cache) &&
                          ::executorch::runtime::tensor_is_contiguous(positions),
                      InvalidArgument, out, "update_cache: tensors must be contiguous");
  const int64_t batch = value.size(0), heads = value.size(1), count = value.size(2);
  const int64_t capacity = cache.size(2);
  const int64_t* position = positions.const_data_ptr<int64_t>();
  // Every position is checked before the first row is written: a refused call leaves the cache as it was.
  for (int64_t i = 0; i < count; ++i) {
    ET_KERNEL_CHECK_MSG(context, position[i] >= 0 && position[i] < capacity, InvalidArgument, out,
                        "update_cache: position %lld is outside the cache's %lld rows",
                        static_cast<long long>(position[i]), static_cast<long long>(capacity));
  }
  const SizesType token_size[1] = {1};
  ET_KERNEL_CHECK_MSG(context, ::executorch::runtime::resize_tensor(out, {token_size, 1}) == Error::Ok,
                      InvalidArgument, out, "update_cache: out must hold one element");

  const size_t row_bytes = static_cast<size_t>(value.size(3)) * value.element_size();
  const auto* source = static_cast<const uint8_t*>(value.const_data_ptr());
  auto* target = static_cast<uint8_t*>(cache.mutable_data_ptr());
  for (int64_t plane = 0; plane < batch * heads; ++plane) {
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(target + (plane * capacity + position[i]) * row_bytes, source + (plane * count + i) * row_bytes,
                  row_bytes);
    }
  }
  if (out.nbytes() > 0) std::memset(out.mutable_data_ptr(), 0, out.nbytes());
  return out;
}

}  // namespace etlab::kernels
