/* LD_PRELOAD shim for bench_peers experiments: refuse the AMX tile-data permission request (arch_prctl
 * ARCH_REQ_XCOMP_PERM), so a library that asks for AMX before using it falls back to its other kernels.
 *   gcc -O2 -shared -fPIC -o deny_amx.so bench/deny_amx.c -ldl; LD_PRELOAD=$PWD/deny_amx.so <command>
 * It says "deny_amx: refused AMX" on stderr the first time it refuses. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>
long syscall(long number, ...) {
  va_list ap; va_start(ap, number);
  long a[6]; for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_arch_prctl && a[0] == 0x1023) { static int said; if (!said++) { const char m[] = "deny_amx: refused AMX\n"; write(2, m, sizeof m - 1); } errno = EPERM; return -1; }
  static long (*real)(long, ...) = 0;
  if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
