#include "numerics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/tag.h>

#include "exit_codes.h"
#include "json.h"

namespace etlab {

namespace et = ::executorch::runtime;
using ::executorch::aten::ScalarType;

namespace {

constexpr char kQparamsSuffix[] = ".qparams";
constexpr size_t kMaxNameInMessage = 80;

const auto kFloat = static_cast<uint8_t>(ScalarType::Float);
const auto kDouble = static_cast<uint8_t>(ScalarType::Double);
const auto kChar = static_cast<uint8_t>(ScalarType::Char);
const auto kByte = static_cast<uint8_t>(ScalarType::Byte);

// A tensor name from an untrusted file, safe for a one-line message.
std::string printable(const std::string& name) {
  std::string out;
  for (const char c : name.substr(0, kMaxNameInMessage)) out += static_cast<unsigned char>(c) < 0x20 ? '?' : c;
  return name.size() > kMaxNameInMessage ? out + "..." : out;
}

[[noreturn]] void reference_error(const std::string& path, const std::string& name, const std::string& problem) {
  throw RunnerError(kExitInputMismatch, "reference file " + path + ": tensor '" + printable(name) + "' " + problem);
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

std::string values_label(int64_t numel) { return "(" + std::to_string(numel) + (numel == 1 ? " value)" : " values)"); }

// "output_<i>", i written as --outputs writes it (no sign, no leading zero); none for any other name.
std::optional<size_t> output_index(const std::string& name) {
  const std::string prefix = "output_";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  size_t index = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + static_cast<size_t>(c - '0');
  }
  return index;
}

bool is_quantized(uint8_t dtype) { return dtype == kChar || dtype == kByte; }

double half_to_double(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  double value = 0;
  if (exponent == 0) {
    value = std::ldexp(mantissa, -24);  // subnormal
  } else if (exponent == 31) {
    value = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    value = std::ldexp(mantissa + 1024, exponent - 25);
  }
  return (bits & 0x8000) ? -value : value;
}

template <typename T>
T element(const NamedTensor& tensor, size_t i) {
  T value;
  std::memcpy(&value, tensor.data.data() + i * sizeof(T), sizeof(T));  // little-endian hosts, as method_io.cpp
  return value;
}

// The output's values as doubles: integers and bools converted, int8/uint8 with qparams dequantized.
std::vector<double> as_doubles(const NamedTensor& tensor, const std::optional<Qparams>& qparams) {
  const auto numel = static_cast<size_t>(tensor.numel());
  std::vector<double> values(numel);
  for (size_t i = 0; i < numel; ++i) {
    switch (static_cast<ScalarType>(tensor.dtype)) {
      case ScalarType::Byte: values[i] = element<uint8_t>(tensor, i); break;
      case ScalarType::Char: values[i] = element<int8_t>(tensor, i); break;
      case ScalarType::Short: values[i] = element<int16_t>(tensor, i); break;
      case ScalarType::Int: values[i] = element<int32_t>(tensor, i); break;
      case ScalarType::Long: values[i] = static_cast<double>(element<int64_t>(tensor, i)); break;
      case ScalarType::Half: values[i] = half_to_double(element<uint16_t>(tensor, i)); break;
      case ScalarType::Float: values[i] = element<float>(tensor, i); break;
      case ScalarType::Double: values[i] = element<double>(tensor, i); break;
      case ScalarType::Bool: values[i] = element<uint8_t>(tensor, i) ? 1.0 : 0.0; break;
      default: break;  // unreachable: collect_output_slots stores only the dtypes ETLT allows
    }
    if (qparams) values[i] = (values[i] - qparams->zero_point) * qparams->scale;
  }
  return values;
}

void widen(std::optional<double>& min, std::optional<double>& max, double value) {
  min = min ? std::min(*min, value) : value;
  max = max ? std::max(*max, value) : value;
}

ReferenceStats compare(const std::vector<double>& values, const std::vector<float>& reference) {
  ReferenceStats stats;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double r = reference[i];
    if (std::isnan(r)) {
      ++stats.nan;
    } else if (std::isinf(r)) {
      ++stats.inf;
    } else {
      widen(stats.min, stats.max, r);
      stats.sum_squares += r * r;
    }
    const double x = values[i];
    if (!std::isfinite(x) || !std::isfinite(r)) continue;
    const double difference = x - r;
    stats.noise += difference * difference;
    stats.dot += x * r;
    stats.max_abs_error = std::max(stats.max_abs_error.value_or(0.0), std::fabs(difference));
    ++stats.pairs;
  }
  return stats;
}

std::string optional_number(const std::optional<double>& value) {
  return value ? json_number_exact(*value) : "null";
}

std::string dims_json(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

std::string entry_json(const OutputStats& stats, const std::vector<bool>& kept) {
  std::string out = "{\"index\": " + std::to_string(stats.index);
  out += ", \"dtype\": " + (stats.is_tensor ? json_string(stats.dtype) : "null");
  out += ", \"dims\": " + (stats.is_tensor ? dims_json(stats.dims) : "null");
  out += ", \"numel\": " + std::to_string(stats.numel) + ", \"nan\": " + std::to_string(stats.nan) +
         ", \"inf\": " + std::to_string(stats.inf) + ", \"zeros\": " + std::to_string(stats.zeros);
  out += ", \"min\": " + optional_number(stats.min) + ", \"max\": " + optional_number(stats.max) +
         ", \"sum_squares\": " + json_number_exact(stats.sum_squares);
  out += ", \"qparams\": " + (stats.qparams ? "{\"scale\": " + json_number_exact(stats.qparams->scale) +
                                                   ", \"zero_point\": " + json_number_exact(stats.qparams->zero_point) +
                                                   "}"
                                             : std::string("null"));
  out += ", \"kept\": " + std::string(kept.empty() ? "null" : kept[stats.index] ? "true" : "false");
  out += ", \"reference\": ";
  if (!stats.reference) return out + "null}";
  const ReferenceStats& r = *stats.reference;
  return out + "{\"min\": " + optional_number(r.min) + ", \"max\": " + optional_number(r.max) +
         ", \"sum_squares\": " + json_number_exact(r.sum_squares) + ", \"nan\": " + std::to_string(r.nan) +
         ", \"inf\": " + std::to_string(r.inf) + ", \"noise\": " + json_number_exact(r.noise) +
         ", \"dot\": " + json_number_exact(r.dot) + ", \"max_abs_error\": " + optional_number(r.max_abs_error) +
         ", \"pairs\": " + std::to_string(r.pairs) + "}}";
}

}  // namespace

References read_references(const std::string& path, const et::MethodMeta& meta) {
  std::vector<NamedTensor> tensors;
  try {
    tensors = read_tensor_file(path);
  } catch (const TensorFileError& error) {
    throw RunnerError(kExitInputMismatch, std::string("--reference: ") + error.what());
  }
  References references;
  references.path = path;
  std::map<size_t, Qparams> qparams;
  std::set<std::string> seen;
  for (const NamedTensor& tensor : tensors) {
    const std::string& name = tensor.name;
    if (!seen.insert(name).second) reference_error(path, name, "appears twice");
    const size_t suffix = sizeof(kQparamsSuffix) - 1;
    const bool is_qparams = name.size() > suffix && name.compare(name.size() - suffix, suffix, kQparamsSuffix) == 0;
    const auto index = output_index(is_qparams ? name.substr(0, name.size() - suffix) : name);
    if (!index) reference_error(path, name, "is neither output_<i> nor output_<i>.qparams");
    if (*index >= meta.num_outputs()) {
      reference_error(path, name, "names output " + std::to_string(*index) + ", but method '" +
                                      std::string(meta.name()) + "' has " + std::to_string(meta.num_outputs()) +
                                      " outputs");
    }
    const auto tag = meta.output_tag(*index);
    if (!tag.ok()) {
      reference_error(path, name, "names output " + std::to_string(*index) + ", whose metadata is unreadable");
    }
    if (tag.get() != et::Tag::Tensor) {
      reference_error(path, name, "names output " + std::to_string(*index) + ", which is a " +
                                      et::tag_to_string(tag.get()) + ", not a tensor");
    }
    if (is_qparams) {
      if (tensor.dtype != kDouble || tensor.dims != std::vector<int64_t>{2}) {
        reference_error(path, name, "is " + dtype_name(tensor.dtype) + " " + format_dims(tensor.dims) +
                                        "; qparams must be float64 [2] (scale, zero_point)");
      }
      const Qparams q{element<double>(tensor, 0), element<double>(tensor, 1)};
      if (!std::isfinite(q.scale) || q.scale <= 0 || !std::isfinite(q.zero_point)) {
        reference_error(path, name, "holds scale " + number(q.scale) + " and zero_point " + number(q.zero_point) +
                                        "; the scale must be finite and > 0, the zero point finite");
      }
      // Outputs whose dtype the metadata cannot tell are checked again after the run.
      const auto info = meta.output_tensor_meta(*index);
      if (info.ok() && !is_quantized(static_cast<uint8_t>(info->scalar_type()))) {
        reference_error(path, name, "dequantizes output " + std::to_string(*index) + ", which is " +
                                        dtype_name(static_cast<uint8_t>(info->scalar_type())) +
                                        "; only int8 and uint8 outputs take qparams");
      }
      qparams[*index] = q;
    } else {
      if (tensor.dtype != kFloat) {
        reference_error(path, name, "is " + dtype_name(tensor.dtype) + "; a reference must be float32");
      }
      OutputReference& reference = references.by_output[*index];
      reference.dims = tensor.dims;
      reference.values.resize(static_cast<size_t>(tensor.numel()));
      if (!tensor.data.empty()) std::memcpy(reference.values.data(), tensor.data.data(), tensor.data.size());
    }
  }
  for (const auto& [index, q] : qparams) {
    const auto found = references.by_output.find(index);
    const std::string name = "output_" + std::to_string(index);
    if (found == references.by_output.end()) {
      reference_error(path, name + kQparamsSuffix, "has no tensor '" + name + "' to go with it");
    }
    found->second.qparams = q;
  }
  return references;
}

std::vector<OutputStats> output_stats(const std::vector<OutputSlot>& slots, const References& references) {
  std::vector<OutputStats> all;
  for (size_t index = 0; index < slots.size(); ++index) {
    const OutputSlot& slot = slots[index];
    const std::string name = "output_" + std::to_string(index);
    const auto found = references.by_output.find(index);
    const OutputReference* reference = found == references.by_output.end() ? nullptr : &found->second;
    OutputStats stats;
    stats.index = index;
    if (!slot.is_tensor()) {
      // The metadata said tensor (read_references checked), the execution did not.
      if (reference) {
        reference_error(references.path, name, "names output " + std::to_string(index) + ", which is a " +
                                                   slot.kind + ", not a tensor");
      }
      all.push_back(stats);
      continue;
    }
    if (!slot.stored) throw RunnerError(kExitUnwritableOutput, slot.unstorable + " (numerics)");
    const NamedTensor& output = *slot.stored;
    stats.is_tensor = true;
    stats.dtype = dtype_name(output.dtype);
    stats.dims = output.dims;
    stats.numel = static_cast<size_t>(output.numel());
    if (reference && reference->qparams) {
      if (!is_quantized(output.dtype)) {
        reference_error(references.path, name + kQparamsSuffix, "dequantizes output " + std::to_string(index) +
                                                                    ", which is " + stats.dtype +
                                                                    "; only int8 and uint8 outputs take qparams");
      }
      stats.qparams = reference->qparams;
    }
    if (reference && reference->values.size() != stats.numel) {
      reference_error(references.path, name, "has shape " + format_dims(reference->dims) + " " +
                                                 values_label(static_cast<int64_t>(reference->values.size())) +
                                                 ", but output " + std::to_string(index) + " has shape " +
                                                 format_dims(output.dims) + " " +
                                                 values_label(static_cast<int64_t>(stats.numel)));
    }
    const std::vector<double> values = as_doubles(output, stats.qparams);
    for (const double x : values) {
      if (std::isnan(x)) {
        ++stats.nan;
      } else if (std::isinf(x)) {
        ++stats.inf;
      } else {
        stats.zeros += x == 0.0;
        widen(stats.min, stats.max, x);
        stats.sum_squares += x * x;
      }
    }
    if (reference) stats.reference = compare(values, reference->values);
    all.push_back(std::move(stats));
  }
  return all;
}

std::string numerics_json(const std::vector<OutputStats>& stats, const std::vector<bool>& kept) {
  std::string out = "{\n  \"schema\": 1,\n  \"outputs\": " + std::to_string(stats.size()) + ",\n  \"tensors\": [";
  for (size_t i = 0; i < stats.size(); ++i) out += (i ? ",\n    " : "\n    ") + entry_json(stats[i], kept);
  return out + (stats.empty() ? "]\n}\n" : "\n  ]\n}\n");
}

}  // namespace etlab
