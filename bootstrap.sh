#!/usr/bin/env bash
# Set up etlab on a fresh Debian/Ubuntu workstation: the Python venv, and with --test the system
# packages the test suite needs (OpenSSH server for fake boards, Chromium for the browser tests, Node for Perfetto's
# trace processor).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")"

want_test=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    -h|--help) echo "usage: ./bootstrap.sh [--test]"; exit 0 ;;
    *) echo "bootstrap.sh: unknown option $arg" >&2; exit 64 ;;
  esac
done

say() { printf '\033[36m▸\033[0m %s\n' "$*" >&2; }

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] < (3, 13)))' 2>/dev/null; then
  echo "bootstrap.sh: etlab needs Python >=3.10,<3.13 (found: $("$python" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 69
fi

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing system packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The local board builds the native runner: it needs a C++ compiler.
command -v g++ >/dev/null 2>&1 || apt_install g++
if [ "$want_test" = 1 ]; then
  apt_install openssh-server openssh-client chromium iproute2 procps postgresql
  # Perfetto's trace processor (wasm) reads the timelines in the tests: Node runs it.
  command -v node >/dev/null 2>&1 || apt_install nodejs
  # Emulated Raspberry Pis (aarch64 under qemu-user) and the aarch64 cross compiler for the runner.
  apt_install qemu-user-static binfmt-support mmdebstrap arch-test zstd g++-aarch64-linux-gnu
fi

install_with_uv() {
  local args
  .venv/bin/python -m pip install -q uv || return 1
  args=$(.venv/bin/python tools/uv_args.py .venv/bin/python) || return 1
  mapfile -t args <<<"$args"
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "${args[@]}" -e '.[test]'
}

stamp=.venv/.etlab-installed
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$python" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing Python packages (torch, executorch, transformers, fabric, model-explorer, ...)"
  # uv installs the same packages in a quarter of pip's time (bench/bench_install.py); it does not read pip's
  # configuration, so tools/uv_args.py hands over what chooses packages (find-links, indexes, constraints). It
  # compiles the bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set nothing else would, and every process
  # would compile what it imports again (`fab --list` 0.90 s instead of 0.47 s). pip stays the fallback.
  if ! install_with_uv; then
    say "uv could not install them: pip does"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]'
  fi
  touch "$stamp"
fi
# Bytecode for our own sources (an editable install has none): every `fab` start reads it, even where
# PYTHONDONTWRITEBYTECODE is set. Stale entries are ignored by Python, so this never goes wrong.
.venv/bin/python -m compileall -q orchestrator tasks.py >/dev/null || true
if [ "$want_test" = 1 ]; then
  # The emulated Pis' rootfs: built once (3-7 min), cached in ~/.cache/etlab/pi-rootfs/<recipe>-<month>.
  if [ "$(id -u)" -eq 0 ]; then
    # Built in the background while the suite runs: only tests/testing/test_pi.py needs it, late in the run, and it
    # waits on the cache's lock. A failed build is retried there: CI fails loudly, elsewhere those tests skip.
    mkdir -p .etlab
    nohup .venv/bin/python tools/emulated_pi.py --prepare >.etlab/pi-rootfs.log 2>&1 </dev/null &
    say "preparing the emulated Pis' rootfs in the background (log: .etlab/pi-rootfs.log)"
  else
    say "not root: the emulated-Pi tests will skip (they need root for namespaces, overlayfs and chroot)"
  fi
fi
say "ready: $(.venv/bin/python -c 'import importlib.metadata as m; print("executorch", m.version("executorch"), "torch", m.version("torch"))')"
