// A method's inputs and outputs as ETLT tensors: generated or read, checked against the method's
// metadata, bound to ExecuTorch tensors, and outputs copied back out.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/method_meta.h>

#include "tensor_file.h"

namespace etlab {

// Deterministic inputs of the right dtype and shape (see README.md, "Generated inputs").
// Throws RunnerError(kExitInputMismatch) for an input that is not a tensor.
std::vector<NamedTensor> generate_inputs(const executorch::runtime::MethodMeta& meta);

// Count, dtype and shape must match the metadata exactly; throws RunnerError(kExitInputMismatch)
// with a one-line message naming the input index, what was expected and what was given.
void validate_inputs(const executorch::runtime::MethodMeta& meta, const std::vector<NamedTensor>& inputs,
                     const std::string& source);

// ExecuTorch tensors viewing the ETLT data; the NamedTensors must outlive this object.
class BoundInputs {
 public:
  explicit BoundInputs(std::vector<NamedTensor>& tensors);
  BoundInputs(const BoundInputs&) = delete;
  BoundInputs& operator=(const BoundInputs&) = delete;
  ~BoundInputs();

  // set_input for each, copied into planned memory; throws RunnerError(kExitInputMismatch).
  void set_all(executorch::runtime::Method& method);

 private:
  struct Bound;
  std::vector<std::unique_ptr<Bound>> bound_;
};

// One output of the method, by index: what --outputs would store of it, and whether it is a tensor.
struct OutputSlot {
  std::string kind;                   // the EValue's tag: "Tensor", "None", "Int", ...
  std::optional<NamedTensor> stored;  // contiguous output_<index>; Int/Double/Bool as 0-dim; none for None
  std::string unstorable;             // not empty: why ETLT cannot hold this output (stored is empty then)

  bool is_tensor() const { return kind == "Tensor"; }
};

// Every output of the last execution, in index order; never throws for an output ETLT cannot hold.
std::vector<OutputSlot> collect_output_slots(executorch::runtime::Method& method);

// The method's outputs as contiguous ETLT tensors named output_<index>. Int, Double and Bool outputs
// become 0-dim tensors; None outputs are skipped. Throws RunnerError(kExitUnwritableOutput) for an
// output ETLT cannot hold.
std::vector<NamedTensor> collect_outputs(executorch::runtime::Method& method);
std::vector<NamedTensor> storable_outputs(std::vector<OutputSlot> slots);

// --outputs-cap: in index order, an output is kept while the data bytes kept so far plus its own stay <= cap; one
// that does not fit is left out and a later, smaller one may still fit. Returns the kept ones, in order.
std::vector<NamedTensor> outputs_within_cap(std::vector<NamedTensor> outputs, uint64_t cap);

}  // namespace etlab
