// Numerics mode (--reference, --numerics-out): statistics of every output of the last execution, and of its
// difference from a reference, for the host to judge accuracy without copying whole outputs off the board.
// Contract: docs/DESIGN.md ("Native runner"); details: ../README.md ("Numerics").
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <executorch/runtime/executor/method_meta.h>

#include "method_io.h"

namespace etlab {

struct Qparams {
  double scale = 1.0;
  double zero_point = 0.0;
};

// output_<i> of the reference file, with output_<i>.qparams when output i is int8/uint8 quantized.
struct OutputReference {
  std::vector<int64_t> dims;
  std::vector<float> values;
  std::optional<Qparams> qparams;
};

struct References {
  std::string path;
  std::map<size_t, OutputReference> by_output;
};

// Reads and checks the reference file against the method's metadata before anything runs; throws
// RunnerError(kExitInputMismatch) naming the file and the tensor.
References read_references(const std::string& path, const executorch::runtime::MethodMeta& meta);

// Statistics of one output (docs/DESIGN.md has the JSON); computed in double precision.
struct ReferenceStats {
  std::optional<double> min, max;  // over finite reference values; none when there are none (null in JSON)
  double sum_squares = 0;
  size_t nan = 0, inf = 0;
  double noise = 0, dot = 0;  // over pairs where both are finite
  std::optional<double> max_abs_error;
  size_t pairs = 0;
};

struct OutputStats {
  size_t index = 0;
  bool is_tensor = false;  // otherwise dtype, dims are null and numel 0
  std::string dtype;
  std::vector<int64_t> dims;
  size_t numel = 0, nan = 0, inf = 0, zeros = 0;
  std::optional<double> min, max;  // over finite values
  double sum_squares = 0;
  std::optional<Qparams> qparams;           // the values were dequantized with these
  std::optional<ReferenceStats> reference;  // none: no reference for this output
};

// Throws RunnerError(kExitInputMismatch) for a reference whose output is no tensor, a numel that differs, or
// qparams for an output that is not int8/uint8; RunnerError(kExitUnwritableOutput) for an output whose dtype
// ETLT cannot hold (as --outputs does).
std::vector<OutputStats> output_stats(const std::vector<OutputSlot>& slots, const References& references);

// kept[i]: whether output i is in the --outputs file; empty without --outputs (null in JSON).
std::string numerics_json(const std::vector<OutputStats>& stats, const std::vector<bool>& kept);

}  // namespace etlab
