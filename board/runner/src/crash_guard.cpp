#include "crash_guard.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace etlab {
namespace {

volatile sig_atomic_t g_exit_code = kExitExecutionFailed;
const char* volatile g_phase = "starting";
alignas(16) char g_alt_stack[64 * 1024];

void append(char* buffer, size_t capacity, size_t& length, const char* text) {
  while (*text != '\0' && length + 1 < capacity) buffer[length++] = *text++;
}

const char* signal_name(int signal_number) {
  switch (signal_number) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "a fatal signal";
  }
}

// Async-signal-safe: only write() and _exit().
extern "C" void on_fatal_signal(int signal_number) {
  char line[512];
  size_t length = 0;
  append(line, sizeof(line), length, "\netlab_runner: error: crashed with ");
  append(line, sizeof(line), length, signal_name(signal_number));
  append(line, sizeof(line), length, " while ");
  append(line, sizeof(line), length, g_phase);
  line[length++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, length);
  (void)ignored;
  _exit(g_exit_code);
}

}  // namespace

void install_crash_guard() {
  stack_t alt_stack{};
  alt_stack.ss_sp = g_alt_stack;
  alt_stack.ss_size = sizeof(g_alt_stack);
  sigaltstack(&alt_stack, nullptr);  // lets a stack overflow reach the handler too
  struct sigaction action {};
  action.sa_handler = on_fatal_signal;
  action.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (const int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    sigaction(signal_number, &action, nullptr);
  }
}

void set_phase(const char* phase, ExitCode exit_code_on_crash) {
  g_phase = phase;
  g_exit_code = exit_code_on_crash;
}

const char* current_phase() { return g_phase; }
ExitCode current_phase_exit_code() { return static_cast<ExitCode>(g_exit_code); }

}  // namespace etlab
