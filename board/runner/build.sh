#!/bin/sh
# Build and install etlab_runner with cmake and ninja from PATH (no Python needed).
#   board/runner/build.sh SDK_DIR BUILD_DIR OUTPUT_DIR   ->  OUTPUT_DIR/etlab_runner
# SDK_DIR holds include/, lib/ and share/cmake/ (the executorch wheel's package folder or
# <workdir>/runtime/<version>/). Extra arguments after the three are passed to the cmake configure step.
set -eu
if [ "$#" -lt 3 ]; then
  echo "usage: $0 SDK_DIR BUILD_DIR OUTPUT_DIR [cmake args...]" >&2
  exit 2
fi
sdk_dir=$1; build_dir=$2; output_dir=$3; shift 3
source_dir=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
for tool in cmake ninja; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build.sh: $tool not found on PATH" >&2; exit 127; }
done
mkdir -p "$output_dir"
output_dir=$(CDPATH= cd -- "$output_dir" && pwd)
cmake -S "$source_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DEXECUTORCH_ROOT="$sdk_dir" -DCMAKE_INSTALL_PREFIX="$output_dir" "$@"
cmake --build "$build_dir" --parallel "${ETLAB_BUILD_JOBS:-2}"
cmake --install "$build_dir"
"$output_dir/etlab_runner" --version
