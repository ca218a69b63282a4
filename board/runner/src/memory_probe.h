// Process memory at phase boundaries: peak and current RSS, read between phases, never sampled during a run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace etlab {

struct MemoryPhase {
  std::string phase;
  int64_t peak_rss_bytes = -1;  // VmHWM since the last reset (or since start when resets are unavailable)
  int64_t rss_bytes = -1;       // VmRSS now
  int64_t maxrss_bytes = -1;    // getrusage ru_maxrss: the peak since the process started, never reset
};

class MemoryProbe {
 public:
  // Tries the first peak reset at once, so every later phase's peak covers that phase alone when it works.
  MemoryProbe();

  // Records the phase and resets the peak for the next one.
  void mark(const std::string& phase);

  bool peak_reset() const { return peak_reset_; }
  const std::vector<MemoryPhase>& phases() const { return phases_; }
  std::string json() const;

 private:
  bool reset_peak();

  bool peak_reset_ = false;
  std::vector<MemoryPhase> phases_;
};

}  // namespace etlab
