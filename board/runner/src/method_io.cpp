#include "method_io.h"

#include <cstring>

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/tag.h>

#include "exit_codes.h"

namespace etlab {

namespace et = ::executorch::runtime;
using ::executorch::aten::ScalarType;
using ::executorch::aten::Tensor;
using ::executorch::aten::TensorImpl;

namespace {

std::string input_label(size_t index) { return "input " + std::to_string(index); }

std::vector<int64_t> meta_dims(const et::TensorInfo& info) {
  std::vector<int64_t> dims;
  for (const int32_t size : info.sizes()) dims.push_back(size);
  return dims;
}

bool is_contiguous_dim_order(const et::TensorInfo& info) {
  const auto order = info.dim_order();
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != i) return false;
  }
  return true;
}

et::TensorInfo tensor_input_meta(const et::MethodMeta& meta, size_t index) {
  const auto tag = meta.input_tag(index);
  if (!tag.ok()) {
    throw RunnerError(kExitInputMismatch, input_label(index) + ": cannot read its metadata");
  }
  if (tag.get() != et::Tag::Tensor) {
    throw RunnerError(kExitInputMismatch, input_label(index) + " is a " + et::tag_to_string(tag.get()) +
                                              "; only tensor inputs are supported");
  }
  auto info = meta.input_tensor_meta(index);
  if (!info.ok()) throw RunnerError(kExitInputMismatch, input_label(index) + ": cannot read its tensor metadata");
  if (!is_contiguous_dim_order(info.get())) {
    throw RunnerError(kExitInputMismatch, input_label(index) + " expects a non-contiguous dim order (unsupported)");
  }
  return info.get();
}

bool is_mask_name(const std::string& name) { return name.find("mask") != std::string::npos; }

// Integer token-id-like values 0..99; a second integer input (or any named like a mask) gets ones.
void fill_integer(NamedTensor& tensor, bool ones) {
  const size_t element = dtype_element_size(tensor.dtype);
  const int64_t count = tensor.numel();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t value = ones ? 1 : (i * 7 + 3) % 100;
    // Little-endian hosts only (aarch64 and x86_64 boards): the low bytes hold the value.
    std::memcpy(tensor.data.data() + i * element, &value, element);
  }
}

void fill_float(NamedTensor& tensor) {
  const int64_t count = tensor.numel();
  for (int64_t i = 0; i < count; ++i) {
    const double value = static_cast<double>((i * 37) % 200 - 100) / 100.0;  // [-1, 1), deterministic
    if (tensor.dtype == static_cast<uint8_t>(ScalarType::Float)) {
      const auto as_float = static_cast<float>(value);
      std::memcpy(tensor.data.data() + i * 4, &as_float, 4);
    } else if (tensor.dtype == static_cast<uint8_t>(ScalarType::Double)) {
      std::memcpy(tensor.data.data() + i * 8, &value, 8);
    }
    // float16 stays zero: no portable conversion needed for a placeholder input.
  }
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) strides[d - 1] = strides[d] * dims[d];
  return strides;
}

}  // namespace

std::vector<NamedTensor> generate_inputs(const et::MethodMeta& meta) {
  std::vector<NamedTensor> inputs;
  size_t integer_inputs = 0;
  for (size_t index = 0; index < meta.num_inputs(); ++index) {
    const et::TensorInfo info = tensor_input_meta(meta, index);
    NamedTensor tensor;
    tensor.name = std::string(info.name());
    if (tensor.name.empty()) tensor.name = "input_" + std::to_string(index);
    tensor.dtype = static_cast<uint8_t>(info.scalar_type());
    tensor.dims = meta_dims(info);
    const size_t element = dtype_element_size(tensor.dtype);
    if (element == 0) {
      throw RunnerError(kExitInputMismatch, input_label(index) + " has " + dtype_name(tensor.dtype) +
                                                ", which cannot be generated; pass --inputs");
    }
    tensor.data.assign(static_cast<size_t>(tensor.numel()) * element, 0);
    switch (info.scalar_type()) {
      case ScalarType::Float:
      case ScalarType::Double:
      case ScalarType::Half:
        fill_float(tensor);
        break;
      case ScalarType::Bool:
        std::memset(tensor.data.data(), 1, tensor.data.size());
        break;
      default:
        fill_integer(tensor, integer_inputs > 0 || is_mask_name(tensor.name));
        ++integer_inputs;
    }
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

void validate_inputs(const et::MethodMeta& meta, const std::vector<NamedTensor>& inputs, const std::string& source) {
  if (inputs.size() != meta.num_inputs()) {
    throw RunnerError(kExitInputMismatch, "method '" + std::string(meta.name()) + "' expects " +
                                              std::to_string(meta.num_inputs()) + " inputs, " + source + " has " +
                                              std::to_string(inputs.size()));
  }
  for (size_t index = 0; index < inputs.size(); ++index) {
    const et::TensorInfo info = tensor_input_meta(meta, index);
    const auto expected_dtype = static_cast<uint8_t>(info.scalar_type());
    const auto expected_dims = meta_dims(info);
    const NamedTensor& given = inputs[index];
    if (given.dtype != expected_dtype || given.dims != expected_dims) {
      throw RunnerError(kExitInputMismatch,
                        input_label(index) + " ('" + given.name + "' in " + source + "): expected " +
                            dtype_name(expected_dtype) + " " + format_dims(expected_dims) + ", got " +
                            dtype_name(given.dtype) + " " + format_dims(given.dims));
    }
  }
}

struct BoundInputs::Bound {
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> dim_order;
  std::vector<TensorImpl::StridesType> strides;
  std::unique_ptr<TensorImpl> impl;
};

BoundInputs::BoundInputs(std::vector<NamedTensor>& tensors) {
  for (NamedTensor& tensor : tensors) {
    auto bound = std::make_unique<Bound>();
    const auto strides = contiguous_strides(tensor.dims);
    for (size_t d = 0; d < tensor.dims.size(); ++d) {
      bound->sizes.push_back(static_cast<TensorImpl::SizesType>(tensor.dims[d]));
      bound->dim_order.push_back(static_cast<TensorImpl::DimOrderType>(d));
      bound->strides.push_back(static_cast<TensorImpl::StridesType>(strides[d]));
    }
    bound->impl = std::make_unique<TensorImpl>(static_cast<ScalarType>(tensor.dtype),
                                               static_cast<ssize_t>(tensor.dims.size()), bound->sizes.data(),
                                               tensor.data.data(), bound->dim_order.data(), bound->strides.data());
    bound_.push_back(std::move(bound));
  }
}

BoundInputs::~BoundInputs() = default;

void BoundInputs::set_all(et::Method& method) {
  for (size_t index = 0; index < bound_.size(); ++index) {
    const et::EValue value(Tensor(bound_[index]->impl.get()));
    const et::Error error = method.set_input(value, index);
    if (error != et::Error::Ok) {
      throw RunnerError(kExitInputMismatch,
                        input_label(index) + ": ExecuTorch rejected it (" + et::to_string(error) + ")");
    }
  }
}

namespace {

// The output as --outputs stores it, or the reason ETLT cannot hold it.
void store_output(const et::EValue& value, size_t index, OutputSlot& slot) {
  NamedTensor out;
  out.name = "output_" + std::to_string(index);
  if (value.isNone()) return;
  if (value.isInt() || value.isDouble() || value.isBool()) {
    if (value.isInt()) {
      const int64_t scalar = value.toInt();
      out.dtype = static_cast<uint8_t>(ScalarType::Long);
      out.data.resize(8);
      std::memcpy(out.data.data(), &scalar, 8);
    } else if (value.isDouble()) {
      const double scalar = value.toDouble();
      out.dtype = static_cast<uint8_t>(ScalarType::Double);
      out.data.resize(8);
      std::memcpy(out.data.data(), &scalar, 8);
    } else {
      out.dtype = static_cast<uint8_t>(ScalarType::Bool);
      out.data.assign(1, value.toBool() ? 1 : 0);
    }
    slot.stored = std::move(out);
    return;
  }
  if (!value.isTensor()) {
    slot.unstorable = "output " + std::to_string(index) + " is a " + et::tag_to_string(value.tag) +
                      ", which ETLT cannot store";
    return;
  }
  const Tensor& tensor = value.toTensor();
  out.dtype = static_cast<uint8_t>(tensor.scalar_type());
  const size_t element = dtype_element_size(out.dtype);
  if (element == 0) {
    slot.unstorable = "output " + std::to_string(index) + " has " + dtype_name(out.dtype) + ", which ETLT cannot store";
    return;
  }
  for (const auto size : tensor.sizes()) out.dims.push_back(size);
  const auto numel = static_cast<size_t>(tensor.numel());
  out.data.resize(numel * element);
  const auto* source = static_cast<const uint8_t*>(tensor.const_data_ptr());
  const auto want = contiguous_strides(out.dims);
  bool contiguous = true;
  for (size_t d = 0; d < out.dims.size(); ++d) {
    contiguous = contiguous && (out.dims[d] <= 1 || tensor.strides()[d] == want[d]);
  }
  if (contiguous || numel == 0) {
    if (numel > 0) std::memcpy(out.data.data(), source, out.data.size());
  } else {
    // Walk the logical index in row-major order and gather from the strided source.
    std::vector<int64_t> position(out.dims.size(), 0);
    for (size_t flat = 0; flat < numel; ++flat) {
      int64_t offset = 0;
      for (size_t d = 0; d < position.size(); ++d) offset += position[d] * tensor.strides()[d];
      std::memcpy(out.data.data() + flat * element, source + offset * static_cast<int64_t>(element), element);
      for (size_t d = position.size(); d-- > 0;) {
        if (++position[d] < out.dims[d]) break;
        position[d] = 0;
      }
    }
  }
  slot.stored = std::move(out);
}

}  // namespace

std::vector<OutputSlot> collect_output_slots(et::Method& method) {
  std::vector<OutputSlot> slots(method.outputs_size());
  for (size_t index = 0; index < slots.size(); ++index) {
    const et::EValue& value = method.get_output(index);
    slots[index].kind = et::tag_to_string(value.tag);
    store_output(value, index, slots[index]);
  }
  return slots;
}

std::vector<NamedTensor> storable_outputs(std::vector<OutputSlot> slots) {
  std::vector<NamedTensor> outputs;
  for (OutputSlot& slot : slots) {
    if (!slot.unstorable.empty()) throw RunnerError(kExitUnwritableOutput, slot.unstorable);
    if (slot.stored) outputs.push_back(std::move(*slot.stored));
  }
  return outputs;
}

std::vector<NamedTensor> collect_outputs(et::Method& method) { return storable_outputs(collect_output_slots(method)); }

std::vector<NamedTensor> outputs_within_cap(std::vector<NamedTensor> outputs, uint64_t cap) {
  std::vector<NamedTensor> kept;
  uint64_t bytes = 0;
  for (NamedTensor& tensor : outputs) {
    if (tensor.data.size() > cap - bytes) continue;  // bytes <= cap always, so no wrap-around
    bytes += tensor.data.size();
    kept.push_back(std::move(tensor));
  }
  return kept;
}

}  // namespace etlab
