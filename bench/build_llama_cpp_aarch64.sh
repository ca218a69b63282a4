#!/bin/sh
# Builds bench_llm_pi.py's peer on the emulated Pi 5: llama.cpp's `llama-bench` for aarch64, cross-built with Debian's
# aarch64-linux-gnu-g++ from the llama.cpp that llama-cpp-python 0.3.36 vendors (the x86 peer's, build_llama_cpp.sh),
# for a Pi 5's Cortex-A76 (armv8.2-a with dotprod and fp16: GGML_NATIVE is off, the build machine is not the board),
# OpenMP and the repacked weights on, linked statically so the board needs none of its libraries.
#
#     sh bench/build_llama_cpp_aarch64.sh [PREFIX]      # default /work/peers/llama-cpp-aarch64
#     sudo .venv/bin/python bench/bench_llm_pi.py --llama-bench PREFIX/build/bin/llama-bench ...
set -eu
release=0.3.36
prefix=${1:-/work/peers/llama-cpp-aarch64}
mkdir -p "$prefix"
if [ ! -d "$prefix/src" ]; then
  python3 -m pip download --no-binary :all: --no-deps -d "$prefix" "llama-cpp-python==$release"
  tar -xzf "$prefix/llama_cpp_python-$release.tar.gz" -C "$prefix"
  mv "$prefix/llama_cpp_python-$release/vendor/llama.cpp" "$prefix/src"
fi
cat >"$prefix/toolchain-aarch64.cmake" <<'EOF'
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static;-L;/usr/aarch64-linux-gnu)
EOF
# a static link needs OpenMP's archive, which CMake's FindOpenMP does not pick by itself
gomp=$(aarch64-linux-gnu-gcc -print-file-name=libgomp.a)
nice -n 10 cmake -S "$prefix/src" -B "$prefix/build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$prefix/toolchain-aarch64.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16 -DGGML_OPENMP=ON \
  -DGGML_CPU_REPACK=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF -DCMAKE_EXE_LINKER_FLAGS=-static \
  -DOpenMP_gomp_LIBRARY="$gomp"
nice -n 10 cmake --build "$prefix/build" --target llama-bench -j "${JOBS:-2}"
qemu-aarch64-static -L /usr/aarch64-linux-gnu "$prefix/build/bin/llama-bench" --help >/dev/null
echo "built $prefix/build/bin/llama-bench"
