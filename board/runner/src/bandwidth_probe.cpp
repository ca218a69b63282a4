#include "bandwidth_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <thread>
#include <vector>

#include "exit_codes.h"
#include "json.h"

namespace etlab {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kMinimumBytes = 256 * kMiB;
constexpr uint64_t kMaximumBytes = 1024 * kMiB;

// The largest cache sysfs lists for cpu0 (the last level), in bytes; 0 when unreadable.
uint64_t last_level_cache_bytes() {
  uint64_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string text;
    if (!(file >> text) || text.empty()) continue;
    uint64_t scale = 1;
    const char unit = text.back();
    if (unit == 'K') scale = 1024;
    if (unit == 'M') scale = kMiB;
    const uint64_t value = std::strtoull(text.c_str(), nullptr, 10) * scale;
    largest = std::max(largest, value);
  }
  return largest;
}

uint64_t available_memory_bytes() {
  std::ifstream file("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (file >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// On x86 the widest vectors the CPU has, chosen at run time: built for the baseline (SSE2), one core issues too
// few loads to fill the memory bus (about 9 against 15 GB/s on a Xeon with AVX-512). Arm's NEON is its baseline.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ETLAB_WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ETLAB_WIDEST_VECTORS
#endif

// Sums 64-bit words a cache line at a time with eight independent accumulators (the loads are the limit).
ETLAB_WIDEST_VECTORS uint64_t sum_words(const uint64_t* words, size_t count) {
  uint64_t sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    for (size_t lane = 0; lane < 8; ++lane) sums[lane] += words[i + lane];
  }
  for (; i < count; ++i) sums[0] += words[i];
  uint64_t total = 0;
  for (const uint64_t sum : sums) total += sum;
  return total;
}

// Runs `work(slice)` on `threads` threads, one slice each; returns the wall seconds from start to the last join.
template <typename Work>
double on_threads(size_t threads, Work work) {
  std::vector<std::thread> pool;
  pool.reserve(threads);
  const auto start = std::chrono::steady_clock::now();
  for (size_t t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (auto& thread : pool) thread.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

uint64_t default_probe_bytes() {
  uint64_t bytes = std::max(kMinimumBytes, 4 * last_level_cache_bytes());
  bytes = std::min(bytes, kMaximumBytes);
  const uint64_t available = available_memory_bytes();
  if (available > 0) bytes = std::min(bytes, std::max<uint64_t>(16 * kMiB, available / 4));
  return bytes;
}

std::string probe_bandwidth_json(size_t threads, uint64_t bytes, size_t rounds) {
  if (threads == 0) threads = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  const size_t words = bytes / sizeof(uint64_t) / threads * threads;  // equal slices
  if (words == 0) throw RunnerError(kExitUsage, "--probe-bytes is smaller than one word per thread");
  std::vector<uint64_t> buffer;
  try {
    buffer.resize(words);
  } catch (const std::bad_alloc&) {
    throw RunnerError(kExitUsage, "cannot allocate " + std::to_string(bytes) + " bytes for the bandwidth probe");
  }
  const size_t slice = words / threads;
  // Each thread writes its own slice first: the pages are resident (and, on NUMA, near the thread that reads them).
  on_threads(threads, [&](size_t t) {
    for (size_t i = t * slice; i < (t + 1) * slice; ++i) buffer[i] = i;
  });
  std::vector<uint64_t> sums(threads);
  std::vector<double> seconds;
  for (size_t round = 0; round <= rounds; ++round) {  // round 0 warms up and is not kept
    const double elapsed = on_threads(threads, [&](size_t t) { sums[t] = sum_words(buffer.data() + t * slice, slice); });
    if (round > 0) seconds.push_back(elapsed);
  }
  uint64_t total = 0;
  for (const uint64_t sum : sums) total += sum;
  const uint64_t read = static_cast<uint64_t>(words) * sizeof(uint64_t);
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const double best = sorted.front();
  const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                          : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;
  std::ostringstream out;
  out << "{\"probe\": \"read_bandwidth\", \"threads\": " << threads << ", \"buffer_bytes\": " << read
      << ", \"llc_bytes\": " << last_level_cache_bytes() << ", \"rounds\": " << seconds.size()
      << ", \"round_seconds\": " << json_number_list(seconds)
      << ", \"best_bytes_per_s\": " << json_number(static_cast<double>(read) / best)
      << ", \"median_bytes_per_s\": " << json_number(static_cast<double>(read) / median)
      << ", \"checksum\": " << total % 1000003 << "}";  // the sums are used: the reads cannot be optimised away
  return out.str();
}

}  // namespace etlab
