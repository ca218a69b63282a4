#include "perf_counters.h"

#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "exit_codes.h"
#include "json.h"

namespace etlab {
namespace {

constexpr uint64_t cache_event(uint64_t cache, uint64_t op, uint64_t result) {
  return cache | (op << 8) | (result << 16);
}

#if defined(__aarch64__) || defined(__arm__)
constexpr bool kArm = true;
#else
constexpr bool kArm = false;
#endif

// Armv8 PMU common events (Arm ARM, D7.10): used where the kernel has no generic event.
constexpr uint64_t kArmL2dCacheRefill = 0x17;

long perf_event_open(perf_event_attr* attr, int group_fd) {
  return syscall(SYS_perf_event_open, attr, 0 /* this thread */, -1 /* any cpu */, group_fd, PERF_FLAG_FD_CLOEXEC);
}

std::string errno_name(int number) {
  switch (number) {
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENODEV: return "ENODEV";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case ENOSYS: return "ENOSYS";
    case EINVAL: return "EINVAL";
    case EMFILE: return "EMFILE";
    case EBUSY: return "EBUSY";
    default: return "errno " + std::to_string(number);
  }
}

int paranoid_level() {
  std::ifstream file("/proc/sys/kernel/perf_event_paranoid");
  int level = 99;
  return (file >> level) ? level : 99;
}

std::string failure_reason(const CounterSpec& spec, int number) {
  switch (number) {
    case ENOENT:
    case ENODEV:
    case EOPNOTSUPP:
      return spec.hardware ? "no hardware PMU exposes this event (no PMU node, or the event is not implemented)"
                           : "the kernel does not offer this event";
    case EACCES:
    case EPERM:
      return "not permitted: perf_event_paranoid is " + std::to_string(paranoid_level()) +
             " (user-space counting needs <= 2, or CAP_PERFMON)";
    case ENOSYS: return "the kernel (or emulator) does not implement perf_event_open";
    default: return std::strerror(number);
  }
}

perf_event_attr attr_for(const CounterSpec& spec) {
  perf_event_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.size = sizeof(attr);
  attr.type = spec.type;
  attr.config = spec.config;
  attr.exclude_kernel = 1;  // user space only: what the operators themselves do
  attr.exclude_hv = 1;
  attr.read_format = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
  return attr;
}

const CounterSpec* find_counter(const std::string& name) {
  for (const auto& spec : counter_table()) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

}  // namespace

const std::vector<CounterSpec>& counter_table() {
  static const std::vector<CounterSpec> table = {
      {"cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, true},
      {"instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, true},
      {"l1d_refills", PERF_TYPE_HW_CACHE,
       cache_event(PERF_COUNT_HW_CACHE_L1D, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS), true},
      // No generic L2 event exists: Arm gets the raw L2D_CACHE_REFILL, elsewhere the last-level cache misses.
      {"l2_refills", kArm ? static_cast<uint32_t>(PERF_TYPE_RAW) : static_cast<uint32_t>(PERF_TYPE_HW_CACHE),
       kArm ? kArmL2dCacheRefill
            : cache_event(PERF_COUNT_HW_CACHE_LL, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS),
       true},
      {"branch_misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_MISSES, true},
      {"task_clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, false},
      {"page_faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, false},
      {"context_switches", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES, false},
  };
  return table;
}

std::vector<std::string> default_counters() {
  std::vector<std::string> names;
  for (const auto& spec : counter_table()) names.emplace_back(spec.name);
  return names;
}

std::vector<std::string> parse_counter_list(const std::string& text) {
  if (text.empty() || text == "default") return default_counters();
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string name = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (find_counter(name) == nullptr) {
      std::string known;
      for (const auto& spec : counter_table()) known += (known.empty() ? "" : ", ") + std::string(spec.name);
      throw RunnerError(kExitUsage, "unknown counter '" + name + "' (known: " + known + ") (see --help)");
    }
    bool seen = false;
    for (const auto& existing : names) seen = seen || existing == name;
    if (!seen) names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

CounterGroup::CounterGroup(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    const CounterSpec* spec = find_counter(name);
    if (spec == nullptr) continue;
    const bool leader = fds_.empty();
    perf_event_attr attr = attr_for(*spec);
    long fd = perf_event_open(&attr, leader ? -1 : fds_.front());
    if (fd < 0 && !leader) {
      // It cannot join the group: say whether it opens at all, for the reason.
      const int group_errno = errno;
      perf_event_attr alone = attr_for(*spec);
      const long probe = perf_event_open(&alone, -1);
      if (probe >= 0) {
        close(static_cast<int>(probe));
        missing_.push_back({name, errno_name(group_errno), "opens alone but cannot join the counter group"});
        continue;
      }
    }
    if (fd < 0) {
      const int number = errno;
      missing_.push_back({name, errno_name(number), failure_reason(*spec, number)});
      continue;
    }
    fds_.push_back(static_cast<int>(fd));
    captured_.push_back(name);
  }
}

CounterGroup::~CounterGroup() {
  for (auto it = fds_.rbegin(); it != fds_.rend(); ++it) close(*it);
}

bool CounterGroup::read(std::vector<uint64_t>& values) const {
  if (fds_.empty()) return false;
  // {nr, time_enabled, time_running, value[nr]}
  uint64_t buffer[3 + 16];
  const size_t wanted = (3 + captured_.size()) * sizeof(uint64_t);
  if (captured_.size() > 16 || ::read(fds_.front(), buffer, sizeof(buffer)) < static_cast<ssize_t>(wanted)) {
    return false;
  }
  values.resize(captured_.size() + 2);
  for (size_t i = 0; i < captured_.size(); ++i) values[i] = buffer[3 + i];
  values[captured_.size()] = buffer[1];
  values[captured_.size() + 1] = buffer[2];
  return true;
}

std::string probe_counters_json() {
  std::string out = "{\"perf_event_paranoid\": " + std::to_string(paranoid_level()) + ", \"counters\": {";
  bool first = true;
  for (const auto& spec : counter_table()) {
    perf_event_attr attr = attr_for(spec);
    const long fd = perf_event_open(&attr, -1);
    const std::string status = fd >= 0 ? "ok" : errno_name(errno);
    if (fd >= 0) close(static_cast<int>(fd));
    out += (first ? "" : ", ") + json_string(spec.name) + ": " + json_string(status);
    first = false;
  }
  return out + "}}";
}

}  // namespace etlab
