// Exit codes and the one error type the runner throws; see docs/DESIGN.md ("Native runner").
#pragma once

#include <stdexcept>
#include <string>

namespace etlab {

enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 2,
  kExitModelMissing = 3,
  kExitCorruptProgram = 4,
  kExitUnknownMethod = 5,
  kExitInputMismatch = 6,
  kExitExecutionFailed = 7,
  kExitVersionMismatch = 8,
  kExitUnwritableOutput = 9,
  kExitNotStarted = 10,  // --start-fd closed without the go byte: nothing was executed
};

// Carries the exit code with the one-line message printed as "etlab_runner: error: <message>".
class RunnerError : public std::runtime_error {
 public:
  RunnerError(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

}  // namespace etlab
