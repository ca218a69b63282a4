#!/bin/sh
# Builds bench_llm.py's peer: llama-cpp-python from its sdist, in a venv of its own (never etlab's .venv), with
# llama.cpp's CPU backend at its best on the machine that builds it: -march=native (GGML_NATIVE), OpenMP, llamafile's
# sgemm, and the repacked weights (GGML_CPU_REPACK: Q4_0/Q8_0 interleaved for the CPU's extra buffer type) on, but
# the AMX buffer type off. The AMX path is what crashed on the Intel VM of bench/README.md's run C (a general
# protection fault in the first llama_decode of a q8_0/Q4_0 model); under GGML_NATIVE the compiler turns it on by
# itself (-march=native defines __AMX_INT8__), so -mno-amx-* take it away; GGML_AMX_* only act without native.
#
#     sh bench/build_llama_cpp.sh [PREFIX]        # default /work/peers/llama-cpp-0.3.36
#     .venv/bin/python bench/bench_llm.py --llama-python PREFIX/bin/python ...
#
# The build flags are written to PREFIX/etlab-build.txt; bench_llm.py records them in its output.
set -eu
release=0.3.36
prefix=${1:-/work/peers/llama-cpp-$release}
python=${PYTHON:-python3.11}
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # CMake takes CFLAGS/CXXFLAGS as its initial flags
cmake_args="-DGGML_NATIVE=ON -DGGML_CPU_REPACK=ON -DGGML_OPENMP=ON -DGGML_LLAMAFILE=ON -DGGML_AMX_TILE=OFF \
-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DCMAKE_BUILD_TYPE=Release -DLLAVA_BUILD=OFF"
# LLAVA_BUILD=OFF skips the multimodal library (mtmd, imported only by a multimodal chat handler): most of the build's
# time, none of the CPU backend
CFLAGS="$no_amx" CXXFLAGS="$no_amx" CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} nice -n 15 \
  "$prefix/bin/python" -m pip install --no-binary llama-cpp-python --no-cache-dir --force-reinstall \
  "llama-cpp-python==$release"
{
  echo "llama-cpp-python $release from its sdist (pip --no-binary), $(gcc --version | head -n 1)"
  echo "CMAKE_ARGS=$cmake_args CFLAGS=CXXFLAGS=$no_amx"
  echo "host: $(uname -m), $(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
} >"$prefix/etlab-build.txt"
cat "$prefix/etlab-build.txt"
