// Hardware and software counters of the calling thread, through one perf_event_open group (user space only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace etlab {

// A counter etlab knows: its name on the command line and in every output, and how perf_event_open selects it.
struct CounterSpec {
  const char* name;
  uint32_t type;     // PERF_TYPE_*
  uint64_t config;   // generic event, cache event or raw Armv8 event number
  bool hardware;     // needs a PMU
};

// The whole table: the default set plus the extras a user may name.
const std::vector<CounterSpec>& counter_table();
// The default set on this architecture (Arm: raw Armv8 events where no generic one exists).
std::vector<std::string> default_counters();
// Parses "a,b,c" (or "default"); throws RunnerError(kExitUsage) naming an unknown counter.
std::vector<std::string> parse_counter_list(const std::string& text);

struct CounterFailure {
  std::string name;
  std::string error;   // ENOENT, EACCES, ...
  std::string reason;  // what it means for this counter
};

// One group: the leader is the first counter that opened. Reading it costs one read() syscall.
class CounterGroup {
 public:
  explicit CounterGroup(const std::vector<std::string>& names);
  ~CounterGroup();
  CounterGroup(const CounterGroup&) = delete;
  CounterGroup& operator=(const CounterGroup&) = delete;

  const std::vector<std::string>& captured() const { return captured_; }
  const std::vector<CounterFailure>& missing() const { return missing_; }
  bool empty() const { return captured_.empty(); }

  // Raw values, then time_enabled and time_running (ns) at the end. False when the read failed.
  bool read(std::vector<uint64_t>& values) const;

 private:
  std::vector<int> fds_;
  std::vector<std::string> captured_;
  std::vector<CounterFailure> missing_;
};

// What a probe of this machine finds: {"name": "ok" | errno name}.
std::string probe_counters_json();

}  // namespace etlab
