// Memory read bandwidth (--probe-bandwidth): the board's memory roofline for a decode step, which reads every weight
// once. Each of N threads sums its own slice of a buffer far larger than the last-level cache; a round is all
// threads reading the whole buffer once, and the best round's bytes per second is the figure (the least disturbed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace etlab {

// The buffer when none is asked for: 4x the last-level cache, at least 256 MiB, at most 1 GiB and a quarter of
// the memory available now.
uint64_t default_probe_bytes();

// JSON: {"probe": "read_bandwidth", "threads", "buffer_bytes", "llc_bytes", "rounds", "round_seconds": [...],
// "best_bytes_per_s", "median_bytes_per_s"}. Throws RunnerError (exit 2) for a buffer it cannot allocate.
std::string probe_bandwidth_json(size_t threads, uint64_t bytes, size_t rounds);

}  // namespace etlab
