// Generate mode: greedy decoding with a program that keeps its KV cache inside (mutable buffers).
// The method is forward(input_ids int64 [1, S], cache_position int64 [S]) -> float logits [1, S, vocab] or
// [1, 1, vocab] (the last position's, etlab's default), S dynamic; the last row is read either way.
// Contract: docs/DESIGN.md ("Native runner"); details: ../README.md ("Generate mode").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <executorch/runtime/core/portable_type/tensor_impl.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/method_meta.h>

#include "tensor_file.h"

namespace etlab {

// The prompt when no --inputs gives one: (i * 7 + 3) % 100, the runner's rule for token ids.
std::vector<int64_t> generated_prompt(size_t length);

// The prompt ids from an ETLT file holding one int64 tensor of shape [1, P] or [P] (P >= 1); when expected_length
// is set, P must equal it. Throws RunnerError(kExitInputMismatch).
std::vector<int64_t> read_prompt(const std::string& path, std::optional<size_t> expected_length);

struct GenerateShape {
  int64_t max_prompt_len = 0;  // the upper bound of input_ids' dim 1
  int64_t vocab_size = 0;      // output 0's last dim
};

// Checks the method is a generation program for the prompt; throws RunnerError(kExitInputMismatch) naming what
// does not fit (inputs, dtypes, ranks, the prompt's ids, the output). A prompt longer than input_ids' upper bound is
// prefilled in chunks.
GenerateShape check_generate_method(const executorch::runtime::MethodMeta& meta, const std::vector<int64_t>& prompt);

struct GenerationRun {
  bool warmup = false;
  double prefill_ms = 0;  // the prefill's executes together
  std::vector<double> prefill_chunk_ms;  // one per prefill execute: the prompt in chunks of at most the chunk size
  std::vector<double> decode_ms;  // new_tokens - 1 entries
  std::vector<int64_t> token_ids;  // new_tokens entries

  double total_ms() const;
};

// One prefill (one execute per chunk of the prompt) and new_tokens - 1 decode steps per run, each run starting from
// position 0 again.
class Generator {
 public:
  // Binds the inputs through set_inputs, runs execute() once and returns its time (ms); which names the step.
  using Execute = std::function<double(const std::string& which, const std::function<void()>& set_inputs)>;

  // chunk: the most prompt ids one prefill execute takes (>= 1, at most input_ids' upper bound).
  Generator(executorch::runtime::Method& method, std::vector<int64_t> prompt, size_t new_tokens, int64_t vocab_size,
            size_t chunk);
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;
  ~Generator();

  GenerationRun run(bool warmup, const std::string& label, const Execute& execute);

 private:
  void bind(size_t length);
  int64_t argmax_last_position(const std::string& which) const;

  executorch::runtime::Method& method_;
  std::vector<int64_t> prompt_;
  size_t new_tokens_;
  int64_t vocab_size_;
  size_t chunk_;
  // Input storage outlives every execute(): a non-planned input shares this memory rather than copying it.
  std::vector<int64_t> ids_;
  std::vector<int64_t> positions_;
  executorch::aten::TensorImpl::SizesType ids_sizes_[2] = {1, 1};
  executorch::aten::TensorImpl::DimOrderType ids_dim_order_[2] = {0, 1};
  executorch::aten::TensorImpl::StridesType ids_strides_[2] = {1, 1};
  executorch::aten::TensorImpl::SizesType positions_sizes_[1] = {1};
  executorch::aten::TensorImpl::DimOrderType positions_dim_order_[1] = {0};
  executorch::aten::TensorImpl::StridesType positions_strides_[1] = {1};
  std::unique_ptr<executorch::aten::TensorImpl> ids_impl_;
  std::unique_ptr<executorch::aten::TensorImpl> positions_impl_;
};

// The last timed run's token ids as output_0, int64 [1, new_tokens].
NamedTensor token_ids_output(const GenerationRun& run);

// timings.json's "generation" object; context is --context when given.
std::string generation_json(size_t prompt_len, size_t new_tokens, std::optional<size_t> context,
                            int64_t max_prompt_len, const std::vector<GenerationRun>& runs);

}  // namespace etlab
