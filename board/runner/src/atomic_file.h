// Crash-safe output files: write to ".etlab-tmp-<name>.<pid>" in the target folder, fsync, rename.
// The prefix matches orchestrator/fsutil.py so its stale-temporary cleanup removes leftovers.
#pragma once

#include <stdexcept>
#include <string>

namespace etlab {

class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Replaces `path` with `content` atomically; throws IoError("cannot write <path>: <reason>").
void write_file_atomically(const std::string& path, const void* content, size_t size);
void write_file_atomically(const std::string& path, const std::string& content);

// Fails early (before a long run) when `path` could not be written later; throws IoError.
void check_writable(const std::string& path);

}  // namespace etlab
