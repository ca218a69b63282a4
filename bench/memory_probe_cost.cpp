// Times MemoryProbe::mark (board/runner/src/memory_probe.cpp) in a process holding RSS_MB of touched memory:
// the whole cost memory accounting adds to a run (the runner marks 5 phases, never during the timed loop).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "memory_probe.h"

int main(int argc, char** argv) {
  const size_t rss_mb = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const int marks = argc > 2 ? std::atoi(argv[2]) : 200;
  std::vector<char> held(rss_mb << 20);
  std::memset(held.data(), 1, held.size());  // resident, like a loaded program and its arenas
  etlab::MemoryProbe probe;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < marks; ++i) {
    std::memset(held.data() + (static_cast<size_t>(i) << 12) % held.size(), 2, 4096);
    probe.mark("phase");
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"rss_mb\": %zu, \"marks\": %d, \"us_per_mark\": %.3f, \"peak_reset\": %s}\n", rss_mb, marks,
              us / marks, probe.peak_reset() ? "true" : "false");
  return held[0] == 3;
}
