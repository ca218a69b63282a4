// Command line of etlab_runner (docs/DESIGN.md, "Native runner").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace etlab {

struct Options {
  bool show_version = false;
  bool show_help = false;
  bool probe_counters = false;
  bool probe_program = false;  // print the program fields read from --model itself, without loading it
  bool probe_bandwidth = false;  // measure the memory read bandwidth at --threads (bandwidth_probe.h)
  std::optional<uint64_t> probe_bytes;  // its buffer (default: default_probe_bytes())
  size_t probe_rounds = 5;
  std::string model;
  std::string method = "forward";
  std::optional<std::string> inputs;
  size_t warmup = 1;
  size_t iterations = 10;
  double max_seconds = 0.0;  // 0 = no time budget
  size_t threads = 0;        // 0 = number of online cores
  std::optional<std::string> etdump;
  std::optional<std::string> outputs;
  std::optional<uint64_t> outputs_cap;  // --outputs keeps, in index order, the outputs whose data bytes still fit
  // Numerics mode (README.md, "Numerics"): statistics of the last execution's outputs against a reference.
  std::optional<std::string> reference;
  std::optional<std::string> numerics_out;
  std::optional<std::string> timings;
  std::optional<std::string> expect_executorch_version;
  std::vector<std::string> counters;        // empty: no counter pass
  std::optional<std::string> counters_out;  // the counters side file
  int start_fd = -1;  // >= 0: after init, wait for the byte 'g' on this descriptor before the first execution
  // Generate mode (README.md, "Generate mode"): each run is one greedy generation of new_tokens ids.
  bool generate = false;
  std::optional<size_t> prompt_len;  // default: the --inputs prompt's length, else kDefaultPromptLen
  size_t new_tokens = 16;
  std::optional<size_t> context;  // the KV cache capacity: prompt_len + new_tokens must not exceed it
  std::optional<size_t> prefill_chunk;  // most prompt ids per prefill execute (default: input_ids' upper bound)
};

constexpr size_t kDefaultPromptLen = 16;

// Throws RunnerError(kExitUsage) naming the bad argument.
Options parse_options(const std::vector<std::string>& args);

const char* usage_text();

}  // namespace etlab
