#include "memory_probe.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "json.h"

namespace etlab {
namespace {

// "VmHWM:     1234 kB" -> bytes, or -1.
void read_status(int64_t& peak, int64_t& rss) {
  peak = rss = -1;
  FILE* file = std::fopen("/proc/self/status", "re");
  if (file == nullptr) return;
  char line[256];
  while (std::fgets(line, sizeof(line), file) != nullptr) {
    long long kb = 0;
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) peak = kb * 1024;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) rss = kb * 1024;
  }
  std::fclose(file);
}

std::string json_int(int64_t value) { return value < 0 ? "null" : std::to_string(value); }

}  // namespace

MemoryProbe::MemoryProbe() { peak_reset_ = reset_peak(); }

bool MemoryProbe::reset_peak() {
  // "5" resets VmHWM to the current RSS (Linux >= 4.0); containers and old kernels may refuse it.
  const int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, "5", 1) == 1;
  close(fd);
  return ok;
}

void MemoryProbe::mark(const std::string& phase) {
  MemoryPhase record;
  record.phase = phase;
  read_status(record.peak_rss_bytes, record.rss_bytes);
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) == 0) record.maxrss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  phases_.push_back(record);
  if (peak_reset_) peak_reset_ = reset_peak();
}

std::string MemoryProbe::json() const {
  std::string out = "{\"peak_reset\": ";
  out += peak_reset_ ? "true" : "false";
  out += ", \"phases\": [";
  for (size_t i = 0; i < phases_.size(); ++i) {
    const auto& p = phases_[i];
    out += (i ? ", " : "") + std::string("{\"phase\": ") + json_string(p.phase) +
           ", \"peak_rss_bytes\": " + json_int(p.peak_rss_bytes) + ", \"rss_bytes\": " + json_int(p.rss_bytes) +
           ", \"maxrss_bytes\": " + json_int(p.maxrss_bytes) + "}";
  }
  return out + "]}";
}

}  // namespace etlab
