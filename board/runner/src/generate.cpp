#include "generate.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/tag.h>

#include "exit_codes.h"
#include "json.h"

namespace etlab {

namespace et = ::executorch::runtime;
using ::executorch::aten::ScalarType;
using ::executorch::aten::Tensor;
using ::executorch::aten::TensorImpl;

namespace {

constexpr auto kLong = static_cast<uint8_t>(ScalarType::Long);

[[noreturn]] void mismatch(const std::string& message) { throw RunnerError(kExitInputMismatch, message); }

et::TensorInfo int64_input(const et::MethodMeta& meta, size_t index, size_t rank, const char* role) {
  const std::string label = "input " + std::to_string(index) + " (" + role + ")";
  const auto tag = meta.input_tag(index);
  if (!tag.ok() || tag.get() != et::Tag::Tensor) mismatch(label + " is not a tensor; not a text-generation program");
  const auto info = meta.input_tensor_meta(index);
  if (!info.ok()) mismatch(label + ": cannot read its tensor metadata");
  if (info->scalar_type() != ScalarType::Long || info->sizes().size() != rank) {
    std::vector<int64_t> dims(info->sizes().begin(), info->sizes().end());
    mismatch(label + " must be an int64 tensor of rank " + std::to_string(rank) + ", the method has " +
             dtype_name(static_cast<uint8_t>(info->scalar_type())) + " " + format_dims(dims) +
             "; not a text-generation program");
  }
  return info.get();
}

}  // namespace

std::vector<int64_t> generated_prompt(size_t length) {
  std::vector<int64_t> ids(length);
  for (size_t i = 0; i < length; ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % 100);
  return ids;
}

std::vector<int64_t> read_prompt(const std::string& path, std::optional<size_t> expected_length) {
  std::vector<NamedTensor> tensors;
  try {
    tensors = read_tensor_file(path);
  } catch (const TensorFileError& error) {
    mismatch(error.what());
  }
  if (tensors.size() != 1) {
    mismatch("the prompt file " + path + " must hold one int64 tensor, it holds " + std::to_string(tensors.size()));
  }
  const NamedTensor& tensor = tensors[0];
  const bool shape_ok = (tensor.dims.size() == 1 || (tensor.dims.size() == 2 && tensor.dims[0] == 1)) &&
                        tensor.dims.back() >= 1;
  if (tensor.dtype != kLong || !shape_ok) {
    mismatch("the prompt '" + tensor.name + "' in " + path + " must be int64 [1, P] or [P] with P >= 1, got " +
             dtype_name(tensor.dtype) + " " + format_dims(tensor.dims));
  }
  const auto length = static_cast<size_t>(tensor.dims.back());
  if (expected_length && *expected_length != length) {
    mismatch("--prompt-len " + std::to_string(*expected_length) + " but the prompt in " + path + " has " +
             std::to_string(length) + " ids");
  }
  std::vector<int64_t> ids(length);
  std::memcpy(ids.data(), tensor.data.data(), length * sizeof(int64_t));  // little-endian hosts, as ETLT
  return ids;
}

GenerateShape check_generate_method(const et::MethodMeta& meta, const std::vector<int64_t>& prompt) {
  if (meta.num_inputs() != 2) {
    mismatch("--generate needs a method with 2 inputs (input_ids, cache_position), '" + std::string(meta.name()) +
             "' has " + std::to_string(meta.num_inputs()) + "; not a text-generation program");
  }
  GenerateShape shape;
  shape.max_prompt_len = int64_input(meta, 0, 2, "input_ids").sizes()[1];
  int64_input(meta, 1, 1, "cache_position");
  const bool output_is_tensor = meta.num_outputs() > 0 && meta.output_tag(0).ok() &&
                                meta.output_tag(0).get() == et::Tag::Tensor;
  const auto output = meta.output_tensor_meta(0);
  if (!output_is_tensor || !output.ok() || output->scalar_type() != ScalarType::Float || output->sizes().empty() ||
      output->sizes()[output->sizes().size() - 1] < 1) {
    mismatch("--generate needs output 0 to be float logits [..., vocab]; not a text-generation program");
  }
  shape.vocab_size = output->sizes()[output->sizes().size() - 1];
  if (shape.max_prompt_len < 1) mismatch("the method's input_ids take no ids (dim 1's upper bound is 0)");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= shape.vocab_size) {
      mismatch("prompt id " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
               " is outside the vocabulary 0.." + std::to_string(shape.vocab_size - 1));
    }
  }
  return shape;
}

double GenerationRun::total_ms() const {
  return std::accumulate(decode_ms.begin(), decode_ms.end(), prefill_ms);
}

Generator::Generator(et::Method& method, std::vector<int64_t> prompt, size_t new_tokens, int64_t vocab_size,
                     size_t chunk)
    : method_(method),
      prompt_(std::move(prompt)),
      new_tokens_(new_tokens),
      vocab_size_(vocab_size),
      chunk_(std::max<size_t>(1, chunk)),
      ids_(prompt_.size()),
      positions_(prompt_.size()) {}

Generator::~Generator() = default;

// The first `length` entries of ids_ and positions_ as input_ids [1, length] and cache_position [length]:
// set_input resizes the method's inputs within their upper bound.
void Generator::bind(size_t length) {
  ids_sizes_[1] = static_cast<TensorImpl::SizesType>(length);
  ids_strides_[0] = static_cast<TensorImpl::StridesType>(length);
  positions_sizes_[0] = static_cast<TensorImpl::SizesType>(length);
  ids_impl_ = std::make_unique<TensorImpl>(ScalarType::Long, 2, ids_sizes_, ids_.data(), ids_dim_order_, ids_strides_);
  positions_impl_ = std::make_unique<TensorImpl>(ScalarType::Long, 1, positions_sizes_, positions_.data(),
                                                 positions_dim_order_, positions_strides_);
  TensorImpl* impls[2] = {ids_impl_.get(), positions_impl_.get()};
  for (size_t index = 0; index < 2; ++index) {
    const et::Error error = method_.set_input(et::EValue(Tensor(impls[index])), index);
    if (error != et::Error::Ok) {
      mismatch("input " + std::to_string(index) + " with " + std::to_string(length) +
               " positions: ExecuTorch rejected it (" + et::to_string(error) + ")");
    }
  }
}

// Greedy choice: the first maximum of the last position's logits.
int64_t Generator::argmax_last_position(const std::string& which) const {
  const et::EValue& value = method_.get_output(0);
  const bool usable = value.isTensor() && value.toTensor().scalar_type() == ScalarType::Float &&
                      value.toTensor().dim() >= 1 && value.toTensor().size(value.toTensor().dim() - 1) == vocab_size_;
  if (!usable) {
    throw RunnerError(kExitExecutionFailed, "output 0 after " + which + " is not float logits [..., " +
                                                std::to_string(vocab_size_) + "]");
  }
  const Tensor& logits = value.toTensor();
  // The last position: the last index of every leading dim, walked through the strides.
  int64_t offset = 0;
  for (ssize_t d = 0; d + 1 < logits.dim(); ++d) offset += (logits.size(d) - 1) * logits.strides()[d];
  const int64_t step = logits.strides()[logits.dim() - 1];
  const float* row = logits.const_data_ptr<float>() + offset;
  int64_t best = 0;
  for (int64_t i = 1; i < vocab_size_; ++i) {
    if (row[i * step] > row[best * step]) best = i;
  }
  return best;
}

GenerationRun Generator::run(bool warmup, const std::string& label, const Execute& execute) {
  GenerationRun result;
  result.warmup = warmup;
  // The prompt in chunks of at most chunk_ ids, each at its own positions: the cache holds the earlier chunks' keys,
  // and the last chunk's last position gives the first token.
  const size_t chunks = (prompt_.size() + chunk_ - 1) / chunk_;
  std::string prefill;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t start = c * chunk_;
    const size_t length = std::min(chunk_, prompt_.size() - start);
    std::copy(prompt_.begin() + static_cast<std::ptrdiff_t>(start),
              prompt_.begin() + static_cast<std::ptrdiff_t>(start + length), ids_.begin());
    std::iota(positions_.begin(), positions_.begin() + static_cast<std::ptrdiff_t>(length), static_cast<int64_t>(start));
    prefill = chunks == 1 ? "the prefill of " + label
                          : "prefill chunk " + std::to_string(c + 1) + " of " + std::to_string(chunks) + " (positions " +
                                std::to_string(start) + ".." + std::to_string(start + length - 1) + ") of " + label;
    const double ms = execute(prefill, [this, length] { bind(length); });
    result.prefill_chunk_ms.push_back(ms);
    result.prefill_ms += ms;
  }
  result.token_ids.push_back(argmax_last_position(prefill));
  for (size_t k = 0; k + 1 < new_tokens_; ++k) {
    // The position is in the message: past the program's cache, the failure is the program's bounds check.
    const auto position = static_cast<int64_t>(prompt_.size() + k);
    const std::string decode =
        "decode step " + std::to_string(k + 1) + " (position " + std::to_string(position) + ") of " + label;
    ids_[0] = result.token_ids.back();
    positions_[0] = position;
    result.decode_ms.push_back(execute(decode, [this] { bind(1); }));
    result.token_ids.push_back(argmax_last_position(decode));
  }
  return result;
}

NamedTensor token_ids_output(const GenerationRun& run) {
  NamedTensor out;
  out.name = "output_0";
  out.dtype = kLong;
  out.dims = {1, static_cast<int64_t>(run.token_ids.size())};
  out.data.resize(run.token_ids.size() * sizeof(int64_t));
  std::memcpy(out.data.data(), run.token_ids.data(), out.data.size());
  return out;
}

std::string generation_json(size_t prompt_len, size_t new_tokens, std::optional<size_t> context,
                            int64_t max_prompt_len, const std::vector<GenerationRun>& runs) {
  std::string executions;
  std::string runs_json;
  for (size_t r = 0; r < runs.size(); ++r) {
    const GenerationRun& run = runs[r];
    for (size_t c = 0; c < run.prefill_chunk_ms.size(); ++c) executions += std::string(r || c ? ", " : "") + "\"prefill\"";
    for (size_t k = 0; k < run.decode_ms.size(); ++k) executions += ", \"decode\"";
    std::string ids;
    for (size_t i = 0; i < run.token_ids.size(); ++i) ids += (i ? ", " : "") + std::to_string(run.token_ids[i]);
    runs_json += std::string(r ? ",\n" : "\n") + "    {\"warmup\": " + (run.warmup ? "true" : "false") +
                 ", \"prefill_ms\": " + json_number(run.prefill_ms) +
                 ", \"prefill_chunk_ms\": " + json_number_list(run.prefill_chunk_ms) +
                 ", \"decode_ms\": " + json_number_list(run.decode_ms) + ", \"token_ids\": [" + ids + "]}";
  }
  return "{\"prompt_len\": " + std::to_string(prompt_len) + ", \"new_tokens\": " + std::to_string(new_tokens) +
         ", \"context\": " + (context ? std::to_string(*context) : std::string("null")) +
         ", \"max_prompt_len\": " + std::to_string(max_prompt_len) + ",\n    \"executions\": [" + executions +
         "],\n    \"runs\": [" + runs_json + "]}";
}

}  // namespace etlab
