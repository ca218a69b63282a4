// etlab_kernel_check: runs etlab's operators (src/kernels/) on tensors from an ETLT file, through ExecuTorch's
// kernel registry as a program would, and writes what they produced. Tests compare it with the PyTorch reference.
//
//   etlab_kernel_check [--threads N] [--isa avx2|avx512vnni|neon|portable] [--repeat N] INPUTS.etlt OUTPUTS.etlt
// (--isa forces each operator that has the instruction set; shared_head alone has avx512vnni)
//
// Inputs are named "<op>.<case>.<arg>", cases in any number:
//   attend.<case>.{query, key_cache, value_cache, positions, scale}   (scale: a float64 scalar)
//   update_cache.<case>.{value, cache, positions}
//   shared_head.<case>.{input, table, scales, bits}                    (bits: an int64 scalar, 8 or 4)
//   rope.<case>.{x, cos, sin}
//   rms_norm.<case>.{x, weight, eps}                                  (eps: a float64 scalar)
// Outputs per case: "<op>.<case>.status" (int64 scalar: 0, or the ExecuTorch error the kernel failed with),
// attend's, rope's, rms_norm's and shared_head's "out", update_cache's "cache" (as the kernel left it) and "out". Stdout gets one JSON line: the
// instruction set, the pool's threads, how many distinct threads ran attend's tasks and, per case, the median
// microseconds of its calls (--repeat N calls each case N more times after the first; for bench/bench_kernels.py).
// Exit: 0 done, 2 usage, 3 unreadable or malformed inputs, 4 an operator is not registered.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/runtime.h>

#include "kernels/etlab_ops.h"
#include "tensor_file.h"
#include "threadpool_control.h"

namespace {

using ::executorch::aten::ScalarType;
using ::executorch::aten::Tensor;
using ::executorch::aten::TensorImpl;
using ::executorch::runtime::EValue;
using ::executorch::runtime::KernelRuntimeContext;
using ::executorch::runtime::Span;
using etlab::NamedTensor;

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "etlab_kernel_check: error: %s\n", message.c_str());
  std::exit(code);
}

// An ExecuTorch tensor over a NamedTensor's bytes (contiguous, default dim order).
struct BoundTensor {
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> dim_order;
  std::vector<TensorImpl::StridesType> strides;
  std::unique_ptr<TensorImpl> impl;

  explicit BoundTensor(NamedTensor& tensor) {
    const size_t rank = tensor.dims.size();
    sizes.resize(rank);
    dim_order.resize(rank);
    strides.resize(rank);
    TensorImpl::StridesType stride = 1;
    for (size_t d = rank; d-- > 0;) {
      sizes[d] = static_cast<TensorImpl::SizesType>(tensor.dims[d]);
      dim_order[d] = static_cast<TensorImpl::DimOrderType>(d);
      strides[d] = stride;
      stride *= sizes[d];
    }
    impl = std::make_unique<TensorImpl>(static_cast<ScalarType>(tensor.dtype), static_cast<ssize_t>(rank),
                                        sizes.data(), tensor.data.data(), dim_order.data(), strides.data());
  }
  Tensor tensor() const { return Tensor(impl.get()); }
};

NamedTensor& argument(std::map<std::string, NamedTensor>& tensors, const std::string& name) {
  auto found = tensors.find(name);
  if (found == tensors.end()) fail(3, "inputs lack " + name);
  return found->second;
}

NamedTensor blank_like(const std::string& name, uint8_t dtype, const std::vector<int64_t>& dims) {
  NamedTensor tensor;
  tensor.name = name;
  tensor.dtype = dtype;
  tensor.dims = dims;
  tensor.data.assign(static_cast<size_t>(tensor.numel()) * etlab::dtype_element_size(dtype), 0);
  return tensor;
}

NamedTensor status_tensor(const std::string& name, int64_t status) {
  NamedTensor tensor = blank_like(name, static_cast<uint8_t>(ScalarType::Long), {});
  std::memcpy(tensor.data.data(), &status, sizeof status);
  return tensor;
}

int repeats = 0;
std::string timings_json;  // "\"<case>\": <median us>, ..."

// Calls the registered operator with `arguments` (the out tensor last), 1 + `repeats` times; returns the first
// call's failure state.
int64_t call(const std::string& name, const char* op, std::vector<EValue>& arguments) {
  auto function = ::executorch::runtime::get_op_function_from_registry(op);
  if (!function.ok()) fail(4, std::string(op) + " is not registered");
  std::vector<EValue*> stack;
  for (auto& value : arguments) stack.push_back(&value);
  KernelRuntimeContext context;
  (*function.get())(context, Span<EValue*>(stack.data(), stack.size()));
  std::vector<double> microseconds;
  for (int i = 0; i < repeats; ++i) {
    KernelRuntimeContext again;
    const auto start = std::chrono::steady_clock::now();
    (*function.get())(again, Span<EValue*>(stack.data(), stack.size()));
    microseconds.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  if (!microseconds.empty()) {
    std::sort(microseconds.begin(), microseconds.end());
    timings_json += (timings_json.empty() ? "\"" : ", \"") + name + "\": " + std::to_string(microseconds[microseconds.size() / 2]);
  }
  return static_cast<int64_t>(context.failure_state());
}

// A float64 scalar argument (attend's scale, rms_norm's eps).
double float64_scalar(const NamedTensor& tensor, const std::string& name) {
  if (tensor.dtype != static_cast<uint8_t>(ScalarType::Double) || tensor.numel() != 1) fail(3, name + " must be one float64");
  double value;
  std::memcpy(&value, tensor.data.data(), sizeof value);
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  size_t threads = 0;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--threads" || arg == "--isa" || arg == "--repeat") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--threads") {
        threads = std::strtoul(value.c_str(), nullptr, 10);
      } else if (arg == "--repeat") {
        repeats = std::atoi(value.c_str());
      } else if (!etlab::kernels::force_attend_isa(value.c_str()) &
                 !etlab::kernels::force_shared_head_isa(value.c_str())) {  // both tried: avx512vnni is the head's
        fail(2, "instruction set " + value + " is not available here");
      }
    } else if (arg.rfind("--", 0) == 0) {
      fail(2, "unknown option " + arg);
    } else {
      files.push_back(arg);
    }
  }
  if (files.size() != 2) fail(2, "usage: etlab_kernel_check [--threads N] [--isa NAME] [--repeat N] INPUTS OUTPUTS");
  ::executorch::runtime::runtime_init();
  const size_t pool_threads = etlab::set_thread_count(threads);

  std::map<std::string, NamedTensor> tensors;
  std::vector<std::string> cases;  // "<op>.<case>", in file order
  try {
    for (auto& tensor : etlab::read_tensor_file(files[0])) {
      const auto dot = tensor.name.rfind('.');
      if (dot == std::string::npos) fail(3, "tensor name " + tensor.name + " is not <op>.<case>.<arg>");
      const std::string prefix = tensor.name.substr(0, dot);
      if (std::find(cases.begin(), cases.end(), prefix) == cases.end()) cases.push_back(prefix);
      tensors.emplace(tensor.name, std::move(tensor));
    }
  } catch (const etlab::TensorFileError& error) {
    fail(3, error.what());
  }

  etlab::kernels::record_attend_threads(true);
  std::vector<NamedTensor> results;
  for (const auto& prefix : cases) {
    if (prefix.rfind("attend.", 0) == 0) {
      NamedTensor& query = argument(tensors, prefix + ".query");
      const double scale_value = float64_scalar(argument(tensors, prefix + ".scale"), prefix + ".scale");
      NamedTensor out = blank_like(prefix + ".out", query.dtype, query.dims);
      BoundTensor q(query), k(argument(tensors, prefix + ".key_cache")), v(argument(tensors, prefix + ".value_cache")),
          p(argument(tensors, prefix + ".positions")), o(out);
      std::vector<EValue> arguments{EValue(q.tensor()), EValue(k.tensor()), EValue(v.tensor()),
                                    EValue(p.tensor()), EValue(scale_value), EValue(o.tensor())};
      const int64_t status = call(prefix, "etlab::attend.out", arguments);
      results.push_back(status_tensor(prefix + ".status", status));
      results.push_back(std::move(out));
    } else if (prefix.rfind("update_cache.", 0) == 0) {
      NamedTensor& value = argument(tensors, prefix + ".value");
      NamedTensor& cache = argument(tensors, prefix + ".cache");
      NamedTensor out = blank_like(prefix + ".out", value.dtype, {1});
      BoundTensor v(value), c(cache), p(argument(tensors, prefix + ".positions")), o(out);
      std::vector<EValue> arguments{EValue(v.tensor()), EValue(c.tensor()), EValue(p.tensor()), EValue(o.tensor())};
      const int64_t status = call(prefix, "etlab::update_cache.out", arguments);
      results.push_back(status_tensor(prefix + ".status", status));
      NamedTensor written = cache;
      written.name = prefix + ".cache";
      results.push_back(std::move(written));
      results.push_back(std::move(out));
    } else if (prefix.rfind("rope.", 0) == 0) {
      NamedTensor& x = argument(tensors, prefix + ".x");
      std::vector<int64_t> dims = x.dims;  // [B, S, H, D] in, [B, H, S, D] out
      if (dims.size() == 4) std::swap(dims[1], dims[2]);
      NamedTensor out = blank_like(prefix + ".out", x.dtype, dims);
      BoundTensor input(x), c(argument(tensors, prefix + ".cos")), s(argument(tensors, prefix + ".sin")), o(out);
      std::vector<EValue> arguments{EValue(input.tensor()), EValue(c.tensor()), EValue(s.tensor()), EValue(o.tensor())};
      const int64_t status = call(prefix, "etlab::rope.out", arguments);
      results.push_back(status_tensor(prefix + ".status", status));
      results.push_back(std::move(out));
    } else if (prefix.rfind("rms_norm.", 0) == 0) {
      NamedTensor& x = argument(tensors, prefix + ".x");
      const double eps = float64_scalar(argument(tensors, prefix + ".eps"), prefix + ".eps");
      NamedTensor out = blank_like(prefix + ".out", x.dtype, x.dims);
      BoundTensor input(x), w(argument(tensors, prefix + ".weight")), o(out);
      std::vector<EValue> arguments{EValue(input.tensor()), EValue(w.tensor()), EValue(eps), EValue(o.tensor())};
      const int64_t status = call(prefix, "etlab::rms_norm.out", arguments);
      results.push_back(status_tensor(prefix + ".status", status));
      results.push_back(std::move(out));
    } else if (prefix.rfind("shared_head.", 0) == 0) {
      NamedTensor& input = argument(tensors, prefix + ".input");
      NamedTensor& table = argument(tensors, prefix + ".table");
      const NamedTensor& bits = argument(tensors, prefix + ".bits");
      if (bits.dtype != static_cast<uint8_t>(ScalarType::Long) || bits.numel() != 1) {
        fail(3, prefix + ".bits must be one int64");
      }
      int64_t bits_value;
      std::memcpy(&bits_value, bits.data.data(), sizeof bits_value);
      std::vector<int64_t> dims = input.dims;
      if (!dims.empty() && !table.dims.empty()) dims.back() = table.dims[0];
      NamedTensor out = blank_like(prefix + ".out", static_cast<uint8_t>(ScalarType::Float), dims);
      BoundTensor i(input), t(table), s(argument(tensors, prefix + ".scales")), o(out);
      std::vector<EValue> arguments{EValue(i.tensor()), EValue(t.tensor()), EValue(s.tensor()), EValue(bits_value),
                                    EValue(o.tensor())};
      const int64_t status = call(prefix, "etlab::shared_head.out", arguments);
      results.push_back(status_tensor(prefix + ".status", status));
      results.push_back(std::move(out));
    } else {
      fail(3, "unknown operator in " + prefix);
    }
  }
  try {
    etlab::write_tensor_file(files[1], results);
  } catch (const std::exception& error) {
    fail(3, error.what());
  }
  std::printf("{\"isa\": \"%s\", \"shared_head_isa\": \"%s\", \"pool_threads\": %zu, \"attend_threads\": %zu, "
              "\"microseconds\": {%s}}\n",
              etlab::kernels::attend_isa(), etlab::kernels::shared_head_isa(), pool_threads,
              etlab::kernels::attend_thread_count(), timings_json.c_str());
  return 0;
}
