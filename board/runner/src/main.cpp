// etlab_runner: loads an ExecuTorch program, runs one method N times and records latency, outputs
// and (optionally) an ETDump. Contract: docs/DESIGN.md ("Native runner"); details: ../README.md.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include "atomic_file.h"
#include "bandwidth_probe.h"
#include "counting_tracer.h"
#include "crash_guard.h"
#include "exit_codes.h"
#include "generate.h"
#include "json.h"
#include "memory_probe.h"
#include "method_io.h"
#include "numerics.h"
#include "options.h"
#include "perf_counters.h"
#include "program_constants.h"
#include "tensor_file.h"
#include "threadpool_control.h"

#ifndef ETLAB_RUNNER_VERSION
#error "ETLAB_RUNNER_VERSION must be defined by the build"
#endif
#ifndef ETLAB_EXECUTORCH_BUILD_VERSION
#error "ETLAB_EXECUTORCH_BUILD_VERSION must be defined by the build"
#endif

namespace etlab {
namespace {

namespace et = ::executorch::runtime;
using ::executorch::etdump::ETDumpGen;
using ::executorch::extension::MallocMemoryAllocator;
using ::executorch::extension::MmapDataLoader;
using Clock = std::chrono::steady_clock;

constexpr size_t kPlannedBufferAlignment = 64;

// "1.5.1+cpu" -> "1.5.1": the release, as orchestrator/versions.py reports it.
std::string executorch_release() {
  const std::string build = ETLAB_EXECUTORCH_BUILD_VERSION;
  return build.substr(0, build.find('+'));
}

std::string version_json() {
  return std::string("{\"runner_version\": ") + json_string(ETLAB_RUNNER_VERSION) +
         ", \"executorch_version\": " + json_string(executorch_release()) +
         ", \"executorch_build_version\": " + json_string(ETLAB_EXECUTORCH_BUILD_VERSION) + "}";
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void check_model_readable(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error_number = errno;
    if (error_number == ENOENT) throw RunnerError(kExitModelMissing, "model file not found: " + path);
    throw RunnerError(kExitModelMissing, "cannot read model file " + path + ": " + std::strerror(error_number));
  }
  struct stat info {};
  const bool is_regular = fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  close(fd);
  if (!is_regular) throw RunnerError(kExitModelMissing, "model path is not a regular file: " + path);
}

void check_outputs_writable(const Options& options) {
  for (const auto* path :
       {&options.outputs, &options.etdump, &options.timings, &options.counters_out, &options.numerics_out}) {
    if (!path->has_value()) continue;
    try {
      check_writable(**path);
    } catch (const IoError& error) {
      throw RunnerError(kExitUnwritableOutput, error.what());
    }
  }
}

std::vector<std::string> method_names(const et::Program& program) {
  std::vector<std::string> names;
  for (size_t i = 0; i < program.num_methods(); ++i) {
    const auto name = program.get_method_name(i);
    if (name.ok()) names.emplace_back(name.get());
  }
  return names;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out.empty() ? "none" : out;
}

// One buffer per memory-planned arena, sized from the method's metadata.
class PlannedMemory {
 public:
  explicit PlannedMemory(const et::MethodMeta& meta) {
    for (size_t i = 0; i < meta.num_memory_planned_buffers(); ++i) {
      const auto size = meta.memory_planned_buffer_size(i);
      if (!size.ok() || size.get() < 0) {
        throw RunnerError(kExitCorruptProgram, "cannot read the size of planned buffer " + std::to_string(i));
      }
      const auto bytes = static_cast<size_t>(size.get());
      const size_t rounded = (bytes + kPlannedBufferAlignment - 1) / kPlannedBufferAlignment * kPlannedBufferAlignment;
      void* data = rounded == 0 ? nullptr : std::aligned_alloc(kPlannedBufferAlignment, rounded);
      if (rounded != 0 && data == nullptr) throw std::bad_alloc();
      buffers_.emplace_back(static_cast<uint8_t*>(data), &std::free);
      spans_.emplace_back(static_cast<uint8_t*>(data), bytes);
      total_bytes_ += bytes;
    }
    allocator_ = std::make_unique<et::HierarchicalAllocator>(et::Span<et::Span<uint8_t>>(spans_.data(), spans_.size()));
  }

  et::HierarchicalAllocator* allocator() { return allocator_.get(); }
  void zero() {
    for (const auto& span : spans_) {
      if (span.size() > 0) std::memset(span.data(), 0, span.size());
    }
  }
  size_t total_bytes() const { return total_bytes_; }
  std::vector<size_t> sizes() const {
    std::vector<size_t> out;
    for (const auto& span : spans_) out.push_back(span.size());
    return out;
  }

 private:
  std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> buffers_;
  std::vector<et::Span<uint8_t>> spans_;
  std::unique_ptr<et::HierarchicalAllocator> allocator_;
  size_t total_bytes_ = 0;
};

struct Timings {
  size_t threads = 0;
  std::string memory_json = "null";
  std::string program_memory_json = "null";
  double load_ms = 0;
  double method_init_ms = 0;
  std::optional<double> start_wait_ms;  // --start-fd: how long the runner waited for the agent's go
  std::vector<double> warmup_ms;
  std::vector<double> iterations_ms;
  bool stopped_early = false;
  std::string inputs_source;
  std::string generation_json = "null";  // generate mode: prompt, steps and tokens of every run
};

std::string timings_json(const Options& options, const Timings& timings) {
  std::string out = "{\n";
  auto field = [&out](const char* name, const std::string& value, bool last = false) {
    out += std::string("  \"") + name + "\": " + value + (last ? "\n" : ",\n");
  };
  field("runner_version", json_string(ETLAB_RUNNER_VERSION));
  field("executorch_version", json_string(executorch_release()));
  field("executorch_build_version", json_string(ETLAB_EXECUTORCH_BUILD_VERSION));
  field("model", json_string(options.model));
  field("method", json_string(options.method));
  field("threads", std::to_string(timings.threads));
  field("load_ms", json_number(timings.load_ms));
  field("method_init_ms", json_number(timings.method_init_ms));
  field("start_wait_ms", timings.start_wait_ms ? json_number(*timings.start_wait_ms) : "null");
  field("warmup_ms", json_number_list(timings.warmup_ms));
  field("iterations_ms", json_number_list(timings.iterations_ms));
  field("warmup_requested", std::to_string(options.warmup));
  field("iterations_requested", std::to_string(options.iterations));
  field("stopped_early", timings.stopped_early ? "true" : "false");
  field("max_seconds", json_number(options.max_seconds));
  field("etdump", options.etdump ? "true" : "false");
  field("inputs_source", json_string(timings.inputs_source));
  field("memory", timings.memory_json);
  field("generation", timings.generation_json);
  field("program_memory", timings.program_memory_json, /*last=*/true);
  return out + "}\n";
}

// What the runner knows of the program without ExecuTorch: the constant data (read from the file) and its size.
std::string program_file_fields(const std::string& model) {
  struct stat info {};
  const long long pte_bytes = stat(model.c_str(), &info) == 0 ? static_cast<long long>(info.st_size) : -1;
  const auto constants = program_constants_bytes(model);
  return "\"constants_bytes\": " + (constants ? std::to_string(*constants) : std::string("null")) +
         ", \"pte_bytes\": " + (pte_bytes < 0 ? std::string("null") : std::to_string(pte_bytes));
}

std::string program_memory_json(const std::string& model, const std::vector<size_t>& arenas) {
  std::string out = "{\"planned_arenas\": [";
  for (size_t i = 0; i < arenas.size(); ++i) out += (i ? ", " : "") + std::to_string(arenas[i]);
  return out + "], " + program_file_fields(model) + "}";
}

// The side file of a counters pass: per execution, one row per profiled instruction, keyed by its ETDump event.
std::string counters_json(const CounterGroup& group, const CountingTracer& tracer, size_t threads) {
  std::string out = "{\n  \"schema\": 1,\n  \"threads\": " + std::to_string(threads) + ",\n";
  out += "  \"scope\": \"user space only (exclude_kernel), read by the thread that runs the operators\",\n";
  out += "  \"captured\": [";
  for (size_t i = 0; i < group.captured().size(); ++i) out += (i ? ", " : "") + json_string(group.captured()[i]);
  out += "],\n  \"missing\": [";
  for (size_t i = 0; i < group.missing().size(); ++i) {
    const auto& m = group.missing()[i];
    out += std::string(i ? ", " : "") + "{\"name\": " + json_string(m.name) + ", \"error\": " + json_string(m.error) +
           ", \"reason\": " + json_string(m.reason) + "}";
  }
  const double ratio = tracer.min_running_ratio();
  out += "],\n  \"multiplexed\": " + std::string(ratio < 1.0 ? "true" : "false") +
         ",\n  \"min_running_ratio\": " + json_number(ratio) +
         ",\n  \"scaling\": \"counts of a multiplexed interval are scaled by time_enabled / time_running\"" +
         ",\n  \"failed_reads\": " + std::to_string(tracer.failed_reads()) +
         ",\n  \"columns\": [\"event_index\", \"chain\", \"instruction\"";
  for (const auto& name : group.captured()) out += ", " + json_string(name);
  out += "],\n  \"executions\": [";
  const auto& executions = tracer.executions();
  for (size_t e = 0; e < executions.size(); ++e) {
    out += e ? ",\n    [" : "\n    [";
    for (size_t r = 0; r < executions[e].size(); ++r) {
      const auto& sample = executions[e][r];
      out += (r ? ", [" : "[") + std::to_string(sample.event_index) + ", " + std::to_string(sample.chain) + ", " +
             std::to_string(sample.instruction);
      for (const auto value : sample.deltas) out += ", " + std::to_string(value);
      out += "]";
    }
    out += "]";
  }
  return out + "\n  ]\n}\n";
}

// --start-fd: the agent hashes the model and inputs while this process loads and initialises them, and writes 'g'
// once both match; it closes the descriptor (EOF) when they do not. Nothing is executed before the 'g'.
void wait_for_start(int fd) {
  char byte = 0;
  ssize_t got = -1;
  do {
    got = read(fd, &byte, 1);
  } while (got < 0 && errno == EINTR);
  const int saved = errno;
  close(fd);
  if (got == 1 && byte == 'g') return;
  throw RunnerError(kExitNotStarted,
                    got < 0 ? "not started: cannot read --start-fd " + std::to_string(fd) + " (" +
                                  std::strerror(saved) + ")"
                            : "not started: the agent did not confirm the model and inputs (--start-fd " +
                                  std::to_string(fd) + " closed)");
}

void write_output(const std::string& what, const std::function<void()>& writer) {
  try {
    writer();
  } catch (const IoError& error) {
    throw RunnerError(kExitUnwritableOutput, std::string(error.what()) + " (" + what + ")");
  }
}

int run(const Options& options) {
  if (options.expect_executorch_version) {
    const std::string& expected = *options.expect_executorch_version;
    if (expected != executorch_release() && expected != ETLAB_EXECUTORCH_BUILD_VERSION) {
      throw RunnerError(kExitVersionMismatch, "ExecuTorch version mismatch: runner built against " +
                                                  std::string(ETLAB_EXECUTORCH_BUILD_VERSION) + ", expected " +
                                                  expected);
    }
  }
  // Generate mode: the prompt is known before the program is loaded, so a run that cannot fit is refused at once.
  std::vector<int64_t> prompt;
  if (options.generate) {
    prompt = options.inputs ? read_prompt(*options.inputs, options.prompt_len)
                            : generated_prompt(options.prompt_len.value_or(kDefaultPromptLen));
    if (options.context && prompt.size() + options.new_tokens > *options.context) {
      throw RunnerError(kExitUsage, "prompt length " + std::to_string(prompt.size()) + " + new tokens " +
                                        std::to_string(options.new_tokens) + " exceeds --context " +
                                        std::to_string(*options.context));
    }
  }
  check_outputs_writable(options);
  check_model_readable(options.model);
  if (options.start_fd >= 0 && fcntl(options.start_fd, F_GETFD) < 0) {
    throw RunnerError(kExitUsage, "--start-fd " + std::to_string(options.start_fd) + " is not an open descriptor");
  }

  Timings timings;
  MemoryProbe memory;  // read between phases only: it never samples during a run
  memory.mark("start");
  // Before any method is loaded: XNNPACK captures the pthreadpool at init.
  set_phase("setting up the thread pool", kExitExecutionFailed);
  const long online_cores = sysconf(_SC_NPROCESSORS_ONLN);
  const size_t wanted_threads = options.threads > 0 ? options.threads : static_cast<size_t>(std::max(1L, online_cores));
  timings.threads = set_thread_count(wanted_threads);

  set_phase("loading the program", kExitCorruptProgram);
  const auto load_start = Clock::now();
  auto loader = MmapDataLoader::from(options.model.c_str(), MmapDataLoader::MlockConfig::NoMlock);
  if (!loader.ok()) {
    throw RunnerError(kExitModelMissing,
                      "cannot map model file " + options.model + " (" + et::to_string(loader.error()) + ")");
  }
  auto program = et::Program::load(&loader.get(), et::Program::Verification::InternalConsistency);
  if (!program.ok()) {
    throw RunnerError(kExitCorruptProgram, options.model + " is not a valid ExecuTorch program (" +
                                               et::to_string(program.error()) + ")");
  }
  timings.load_ms = ms_since(load_start);
  memory.mark("load");

  const auto names = method_names(program.get());
  if (std::find(names.begin(), names.end(), options.method) == names.end()) {
    throw RunnerError(kExitUnknownMethod, "method '" + options.method + "' not found in " + options.model +
                                              " (methods: " + join(names) + ")");
  }
  auto meta = program->method_meta(options.method.c_str());
  if (!meta.ok()) {
    throw RunnerError(kExitCorruptProgram, "cannot read metadata of method '" + options.method + "' in " +
                                               options.model + " (" + et::to_string(meta.error()) + ")");
  }

  set_phase("preparing inputs", kExitInputMismatch);
  std::vector<NamedTensor> inputs;
  GenerateShape generate_shape;
  if (options.generate) {
    generate_shape = check_generate_method(meta.get(), prompt);
    timings.inputs_source = options.inputs ? "file" : "generated";
  } else if (options.inputs) {
    try {
      inputs = read_tensor_file(*options.inputs);
    } catch (const TensorFileError& error) {
      throw RunnerError(kExitInputMismatch, error.what());
    }
    validate_inputs(meta.get(), inputs, *options.inputs);
    timings.inputs_source = "file";
  } else {
    inputs = generate_inputs(meta.get());
    validate_inputs(meta.get(), inputs, "generated inputs");
    timings.inputs_source = "generated";
  }
  BoundInputs bound_inputs(inputs);
  // Checked now, so a bad reference costs no run.
  std::optional<References> references;
  if (options.reference) references = read_references(*options.reference, meta.get());

  set_phase("initialising the method", kExitCorruptProgram);
  PlannedMemory planned_memory(meta.get());
  // The KV cache is a mutable buffer in planned memory with no serialized initial state: start it at zero, as the
  // eager model's cache does (positions not yet written are masked, but garbage could hold NaN).
  if (options.generate) planned_memory.zero();
  MallocMemoryAllocator method_allocator;
  MallocMemoryAllocator temp_allocator;  // reset by the runtime after each instruction
  et::MemoryManager memory_manager(&method_allocator, planned_memory.allocator(), &temp_allocator);
  // Without a buffer ETDumpGen builds with flatcc's heap allocator, which grows as events arrive,
  // so no ETDump size limit applies (a fixed buffer would abort once full).
  std::unique_ptr<ETDumpGen> etdump = options.etdump ? std::make_unique<ETDumpGen>() : nullptr;
  // The counters pass wraps the ETDumpGen: every call is forwarded, so the ETDump is what Inspector reads.
  std::unique_ptr<CounterGroup> counters;
  std::unique_ptr<CountingTracer> counting;
  if (!options.counters.empty() && etdump) {
    counters = std::make_unique<CounterGroup>(options.counters);
    counting = std::make_unique<CountingTracer>(*etdump, *counters);
  }
  et::EventTracer* tracer = counting ? static_cast<et::EventTracer*>(counting.get()) : etdump.get();
  const auto init_start = Clock::now();
  auto method = program->load_method(options.method.c_str(), &memory_manager, tracer);
  if (!method.ok()) {
    throw RunnerError(kExitCorruptProgram, "cannot initialise method '" + options.method + "' of " + options.model +
                                               " (" + et::to_string(method.error()) + "; see the log above)");
  }
  timings.method_init_ms = ms_since(init_start);
  memory.mark("method_init");
  timings.program_memory_json = program_memory_json(options.model, planned_memory.sizes());
  if (options.start_fd >= 0) {
    set_phase("waiting for the agent's go", kExitNotStarted);
    const auto wait_start = Clock::now();
    wait_for_start(options.start_fd);
    timings.start_wait_ms = ms_since(wait_start);
  }

  // Each execute() is its own "Execute" ETDump block (Method::execute opens it); load_method made "Default".
  const auto budget_start = Clock::now();
  auto budget_spent = [&]() {
    return options.max_seconds > 0 && ms_since(budget_start) >= options.max_seconds * 1000.0;
  };
  bool first_execution_marked = false;
  auto execute_once = [&](const std::string& which, const std::function<void()>& set_inputs) {
    set_phase("setting inputs", kExitInputMismatch);
    set_inputs();  // every execution: planned input memory may be reused by activations
    set_phase("executing the method", kExitExecutionFailed);
    const auto start = Clock::now();
    const et::Error error = method->execute();
    const double elapsed = ms_since(start);
    if (error != et::Error::Ok) {
      throw RunnerError(kExitExecutionFailed, "execution failed in " + which + " (" + et::to_string(error) + ")");
    }
    if (!first_execution_marked) {
      memory.mark("first_execution");
      first_execution_marked = true;
    }
    return elapsed;
  };
  auto set_bound_inputs = [&] { bound_inputs.set_all(method.get()); };
  // A run is one execute(), or in generate mode one generation (a prefill and its decode steps).
  std::unique_ptr<Generator> generator;
  std::vector<GenerationRun> generations;
  if (options.generate) {
    const auto bound = static_cast<size_t>(generate_shape.max_prompt_len);
    const size_t chunk = std::min(options.prefill_chunk.value_or(bound), bound);
    generator = std::make_unique<Generator>(method.get(), prompt, options.new_tokens, generate_shape.vocab_size, chunk);
  }
  auto run_once = [&](bool warmup, const std::string& which) -> double {
    if (!generator) return execute_once(which, set_bound_inputs);
    generations.push_back(generator->run(warmup, which, execute_once));
    if (generations.size() == 1) memory.mark("decode");  // the first generation's decode steps
    return generations.back().total_ms();
  };
  for (size_t i = 0; i < options.warmup; ++i) {
    if (i > 0 && budget_spent()) {
      timings.stopped_early = true;
      break;
    }
    timings.warmup_ms.push_back(
        run_once(true, "warmup run " + std::to_string(i + 1) + " of " + std::to_string(options.warmup)));
  }
  for (size_t i = 0; i < options.iterations; ++i) {
    if (i > 0 && budget_spent()) {
      timings.stopped_early = true;
      break;
    }
    timings.iterations_ms.push_back(
        run_once(false, "timed run " + std::to_string(i + 1) + " of " + std::to_string(options.iterations)));
  }
  if (generator) {
    timings.generation_json = generation_json(prompt.size(), options.new_tokens, options.context,
                                              generate_shape.max_prompt_len, generations);
  }

  memory.mark("end");
  timings.memory_json = memory.json();
  set_phase("writing results", kExitUnwritableOutput);
  std::vector<OutputSlot> slots;  // every output of the last execution, by index
  if (!generator && (options.outputs || references)) slots = collect_output_slots(method.get());
  // Before any file is written: a reference that does not fit its output (exit 6) leaves nothing behind.
  std::vector<OutputStats> numerics;
  if (references) {
    set_phase("comparing the outputs with the reference", kExitInputMismatch);
    numerics = output_stats(slots, *references);
    set_phase("writing results", kExitUnwritableOutput);
  }
  std::vector<bool> kept;  // per output index: in the --outputs file; empty without --outputs
  if (options.outputs) {
    // Generate mode: the last timed generation's token ids, not the last step's logits.
    const size_t output_count = slots.size();
    auto outputs = generator ? std::vector<NamedTensor>{token_ids_output(generations.back())}
                             : storable_outputs(std::move(slots));
    if (options.outputs_cap) outputs = outputs_within_cap(std::move(outputs), *options.outputs_cap);
    kept.assign(output_count, false);
    for (size_t i = 0; i < output_count; ++i) {
      const std::string name = "output_" + std::to_string(i);
      kept[i] = std::any_of(outputs.begin(), outputs.end(), [&](const NamedTensor& t) { return t.name == name; });
    }
    write_output("outputs", [&] { write_tensor_file(*options.outputs, outputs); });
  }
  if (references && options.numerics_out) {
    write_output("numerics", [&] { write_file_atomically(*options.numerics_out, numerics_json(numerics, kept)); });
  }
  if (etdump) {
    const auto result = etdump->get_etdump_data();
    std::unique_ptr<void, decltype(&std::free)> owned(result.buf, &std::free);
    if (result.buf == nullptr || result.size == 0) {
      throw RunnerError(kExitUnwritableOutput, "ETDump is empty; nothing to write to " + *options.etdump);
    }
    write_output("etdump", [&] { write_file_atomically(*options.etdump, result.buf, result.size); });
  }
  if (counting && options.counters_out) {
    write_output("counters", [&] {
      write_file_atomically(*options.counters_out, counters_json(*counters, *counting, timings.threads));
    });
  }
  if (options.timings) {
    write_output("timings",
                 [&] { write_file_atomically(*options.timings, timings_json(options, timings)); });
  }
  return kExitOk;
}

void print_error(const std::string& message) {
  std::cout.flush();
  std::fflush(stderr);
  std::fprintf(stderr, "etlab_runner: error: %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace
}  // namespace etlab

int main(int argc, char** argv) {
  using namespace etlab;
  install_crash_guard();
  try {
    const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
    if (options.show_help) {
      std::fputs(usage_text(), stdout);
      return kExitOk;
    }
    if (options.show_version) {
      std::printf("%s\n", version_json().c_str());
      return kExitOk;
    }
    if (options.probe_counters) {
      std::printf("%s\n", probe_counters_json().c_str());
      return kExitOk;
    }
    if (options.probe_bandwidth) {
      const uint64_t bytes = options.probe_bytes ? *options.probe_bytes : default_probe_bytes();
      std::printf("%s\n", probe_bandwidth_json(options.threads, bytes, options.probe_rounds).c_str());
      return kExitOk;
    }
    if (options.probe_program) {
      check_model_readable(options.model);
      std::printf("{%s}\n", program_file_fields(options.model).c_str());
      return kExitOk;
    }
    executorch::runtime::runtime_init();
    return run(options);
  } catch (const RunnerError& error) {
    print_error(error.what());
    return error.code();
  } catch (const std::bad_alloc&) {
    print_error(std::string("out of memory while ") + current_phase());
    return current_phase_exit_code();
  } catch (const std::exception& error) {
    print_error(std::string(error.what()) + " while " + current_phase());
    return current_phase_exit_code();
  }
}
