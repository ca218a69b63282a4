#include "options.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "exit_codes.h"
#include "perf_counters.h"

namespace etlab {
namespace {

[[noreturn]] void usage_error(const std::string& message) {
  throw RunnerError(kExitUsage, message + " (see --help)");
}

size_t parse_count(const std::string& option, const std::string& text, size_t minimum) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < static_cast<long long>(minimum) ||
      value > std::numeric_limits<int32_t>::max()) {
    usage_error(option + " needs an integer >= " + std::to_string(minimum) + ", got '" + text + "'");
  }
  return static_cast<size_t>(value);
}

uint64_t parse_bytes(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < 0) {
    usage_error(option + " needs a number of bytes >= 0, got '" + text + "'");
  }
  return static_cast<uint64_t>(value);
}

int parse_descriptor(const std::string& option, const std::string& text) {
  return static_cast<int>(parse_count(option, text, 0));
}

double parse_seconds(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(value) || value < 0) {
    usage_error(option + " needs a number of seconds >= 0, got '" + text + "'");
  }
  return value;
}

}  // namespace

const char* usage_text() {
  return "usage: etlab_runner --model PATH [--inputs PATH] [--method NAME] [--warmup N] [--iterations N]\n"
         "                    [--max-seconds S] [--threads N] [--etdump PATH] [--outputs PATH]\n"
         "                    [--timings PATH] [--expect-executorch-version V]\n"
         "                    [--counters LIST --counters-out PATH] [--start-fd N]\n"
         "                    [--generate [--prompt-len P] [--new-tokens N] [--context C] [--prefill-chunk K]]\n"
         "                    [--outputs-cap BYTES] [--reference PATH --numerics-out PATH]\n"
         "       etlab_runner --version | --probe-counters | --probe-program --model PATH\n"
         "       etlab_runner --probe-bandwidth [--threads N] [--probe-bytes B] [--probe-rounds R]\n"
         "\n"
         "Runs an ExecuTorch program (.pte) and records per-iteration latency.\n"
         "  --model PATH       the .pte to run\n"
         "  --inputs PATH      ETLT tensor file with the method's inputs (default: generated)\n"
         "  --method NAME      method to run (default: forward)\n"
         "  --warmup N         untimed runs first (default: 1)\n"
         "  --iterations N     timed runs (default: 10, at least 1)\n"
         "  --max-seconds S    stop early once S seconds have passed and one timed run is done (0 = no limit)\n"
         "  --threads N        thread pool size (default: number of online cores)\n"
         "  --etdump PATH      profile with ETDump and write it here\n"
         "  --outputs PATH     write the last run's outputs as ETLT (output_0, output_1, ...)\n"
         "  --outputs-cap BYTES   with --outputs: keep outputs in index order while their data bytes total <= BYTES;\n"
         "                     one that would exceed it is left out, a later smaller one may still fit\n"
         "  --reference PATH   ETLT file of reference values: output_<i> (float32) for output i, and for an\n"
         "                     int8/uint8 output output_<i>.qparams (float64 [scale, zero_point]): compared as\n"
         "                     (q - zero_point) * scale; read and checked before anything runs (exit 6);\n"
         "                     needs --numerics-out\n"
         "  --numerics-out PATH   write statistics of every output of the last run, and of its difference from\n"
         "                     the reference, as JSON (numerics.json); needs --reference\n"
         "  --timings PATH     write timings.json\n"
         "  --expect-executorch-version V   exit 8 unless the runner was built against ExecuTorch V\n"
         "  --counters LIST    read these counters (comma-separated, or 'default') around every kernel and\n"
         "                     delegate call, in the thread that runs them; needs --etdump and --counters-out\n"
         "  --counters-out PATH   write the per-instruction counter deltas (JSON) here\n"
         "  --start-fd N       load and initialise, then wait for the byte 'g' on descriptor N before the first\n"
         "                     run (the agent verifies the model meanwhile); anything else, or EOF: exit 10\n"
         "  --generate         each run is one greedy generation: a prefill of the prompt, then N-1 decode steps\n"
         "                     (method forward(input_ids int64 [1, S], cache_position int64 [S]) -> logits);\n"
         "                     --inputs, if given, holds the prompt ids (one int64 tensor [1, P] or [P])\n"
         "  --prompt-len P     prompt length without --inputs (default: 16); with --inputs it must match\n"
         "  --new-tokens N     tokens generated per run (default: 16)\n"
         "  --prefill-chunk K  prefill at most K prompt ids per execute (default: the most the program takes)\n"
         "  --context C        the program's KV cache capacity: P + N > C is refused before loading (exit 2)\n"
         "  --probe-counters   print which counters this machine can open, as JSON\n"
         "  --probe-bandwidth  measure the memory read bandwidth: --threads threads (default: all cores) each\n"
         "                     sum their slice of a buffer of --probe-bytes (default: 4x the last-level cache,\n"
         "                     256 MiB to 1 GiB), --probe-rounds times (default 5); print JSON, the best round\n"
         "  --probe-program    print what the runner reads from --model without ExecuTorch, as JSON:\n"
         "                     {\"constants_bytes\", \"pte_bytes\"} (null when unreadable); nothing is run\n"
         "Exit codes: 0 ok, 2 usage, 3 model missing, 4 corrupt program, 5 unknown method,\n"
         "            6 input or reference mismatch, 7 execution failed, 8 version mismatch,\n"
         "            9 cannot write an output file,\n"
         "            10 not started (--start-fd closed without 'g').\n";
}

Options parse_options(const std::vector<std::string>& args) {
  Options options;
  std::vector<std::string> generate_only;  // options that mean nothing without --generate
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> inline_value;
    if (const auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "--version" || name == "--help" || name == "-h" || name == "--probe-counters" ||
        name == "--probe-program" || name == "--probe-bandwidth") {
      if (inline_value) usage_error(name + " takes no value");
      (name == "--version"           ? options.show_version
       : name == "--probe-counters"  ? options.probe_counters
       : name == "--probe-program"   ? options.probe_program
       : name == "--probe-bandwidth" ? options.probe_bandwidth
                                    : options.show_help) = true;
      continue;
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) usage_error(name + " needs a value");
      return args[++i];
    };
    if (name == "--model") {
      options.model = value();
    } else if (name == "--method") {
      options.method = value();
    } else if (name == "--inputs") {
      options.inputs = value();
    } else if (name == "--warmup") {
      options.warmup = parse_count(name, value(), 0);
    } else if (name == "--iterations") {
      options.iterations = parse_count(name, value(), 1);
    } else if (name == "--max-seconds") {
      options.max_seconds = parse_seconds(name, value());
    } else if (name == "--threads") {
      options.threads = parse_count(name, value(), 1);
    } else if (name == "--etdump") {
      options.etdump = value();
    } else if (name == "--outputs") {
      options.outputs = value();
    } else if (name == "--outputs-cap") {
      options.outputs_cap = parse_bytes(name, value());
    } else if (name == "--reference") {
      options.reference = value();
    } else if (name == "--numerics-out") {
      options.numerics_out = value();
    } else if (name == "--timings") {
      options.timings = value();
    } else if (name == "--counters") {
      options.counters = parse_counter_list(value());
    } else if (name == "--counters-out") {
      options.counters_out = value();
    } else if (name == "--start-fd") {
      options.start_fd = parse_descriptor(name, value());
    } else if (name == "--generate") {
      if (inline_value) usage_error(name + " takes no value");
      options.generate = true;
    } else if (name == "--prompt-len") {
      options.prompt_len = parse_count(name, value(), 1);
      generate_only.push_back(name);
    } else if (name == "--new-tokens") {
      options.new_tokens = parse_count(name, value(), 1);
      generate_only.push_back(name);
    } else if (name == "--prefill-chunk") {
      options.prefill_chunk = parse_count(name, value(), 1);
      generate_only.push_back(name);
    } else if (name == "--context") {
      options.context = parse_count(name, value(), 2);
      generate_only.push_back(name);
    } else if (name == "--probe-bytes") {
      options.probe_bytes = parse_bytes(name, value());
    } else if (name == "--probe-rounds") {
      options.probe_rounds = parse_count(name, value(), 1);
    } else if (name == "--expect-executorch-version") {
      options.expect_executorch_version = value();
    } else {
      usage_error("unknown argument '" + args[i] + "'");
    }
  }
  if (options.probe_program && options.model.empty()) usage_error("--probe-program needs --model");
  if ((options.probe_bytes || options.probe_rounds != 5) && !options.probe_bandwidth) {
    usage_error(std::string(options.probe_bytes ? "--probe-bytes" : "--probe-rounds") + " needs --probe-bandwidth");
  }
  if (!options.show_version && !options.show_help && !options.probe_counters && !options.probe_program &&
      !options.probe_bandwidth) {
    if (options.model.empty()) usage_error("--model is required");
    if (options.method.empty()) usage_error("--method must not be empty");
    for (const auto* path : {&options.inputs, &options.etdump, &options.outputs, &options.timings,
                             &options.reference, &options.numerics_out}) {
      if (path->has_value() && (*path)->empty()) usage_error("an output or input path must not be empty");
    }
    if (!options.counters.empty() && (!options.counters_out || !options.etdump)) {
      usage_error("--counters needs --counters-out and --etdump (the deltas are keyed by ETDump event)");
    }
    if (options.counters_out && options.counters.empty()) usage_error("--counters-out needs --counters");
    if (!generate_only.empty() && !options.generate) usage_error(generate_only.front() + " needs --generate");
    if (options.outputs_cap && !options.outputs) usage_error("--outputs-cap needs --outputs");
    // A generation's outputs are token ids, not the method's outputs a reference would describe.
    if (options.generate && (options.reference || options.numerics_out)) {
      const char* option = options.reference ? "--reference" : "--numerics-out";
      usage_error(std::string(option) + " cannot be used with --generate");
    }
    if (options.numerics_out && !options.reference) usage_error("--numerics-out needs --reference");
    if (options.reference && !options.numerics_out) {
      usage_error("--reference needs --numerics-out (the comparison is written there)");
    }
  }
  return options;
}

}  // namespace etlab
