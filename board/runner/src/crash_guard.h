// Turns a crash inside ExecuTorch (SIGSEGV, SIGBUS, an ET_CHECK abort, ...) into our one-line error
// and an exit code that depends on what the runner was doing, instead of a core dump.
#pragma once

#include "exit_codes.h"

namespace etlab {

void install_crash_guard();

// What the runner is doing now; `phase` must be a string literal.
void set_phase(const char* phase, ExitCode exit_code_on_crash);
const char* current_phase();
ExitCode current_phase_exit_code();

}  // namespace etlab
