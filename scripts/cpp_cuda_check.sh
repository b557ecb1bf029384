#!/usr/bin/env bash
# Run fp16 ResNet-50 and BERT-base engines in the C++ runtime on a GPU and compare them with the Python runtime.
#   OUT=/some/dir PYTHONPATH=$PWD/src bash scripts/cpp_cuda_check.sh        (from the repo root, on a GPU machine)
# Writes the table to $OUT/cpp_cuda.txt (and the saved modules, inputs and outputs under $OUT/work).
# The build needs RapidJSON's headers (rapidjson-dev) and OpenSSL's (libssl-dev); where they are not installed,
# CMAKE_ARGS passes their places, e.g. CMAKE_ARGS="-DRAPIDJSON_INCLUDE_DIR=$PWD/shared/include -DOPENSSL_ROOT_DIR=...".
# DRY_RUN=1 checks the steps on a CPU machine: small fp32 models, backend="reference", --device cpu.
set -euo pipefail
OUT=${OUT:?set OUT to an output directory}
PY=${PYTHON:-python}
JOBS=${JOBS:-16}
RUNS=${RUNS:-50}
BUILD=${BUILD:-build/cpp-cuda}
WORK="$OUT/work"
DEVICE=cuda
DRY=()
if [[ "${DRY_RUN:-0}" == 1 ]]; then DEVICE=cpu; DRY=(--dry-run); fi
step() { echo "== $(date +%T) $*"; }
mkdir -p "$WORK"

step "check the build's headers"
for header in rapidjson/reader.h openssl/sha.h; do
  if ! echo "#include <$header>" | g++ -E -x c++ - > /dev/null 2>&1; then
    echo "warning: <$header> is not on the compiler's default path; CMAKE_ARGS must say where it is" >&2
  fi
done

step "build csrc and examples/cpp ($BUILD, -j$JOBS)"
PREFIX=$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of -D options
cmake -S csrc -B "$BUILD/runtime" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD/runtime" -j "$JOBS"
cmake -S examples/cpp -B "$BUILD/example" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
  -DTORCHKILN_RUNTIME="$PWD/$BUILD/runtime/libtorchkiln_runtime.so"
cmake --build "$BUILD/example" -j "$JOBS"

step "compile, save and time the Python runtime"
"$PY" scripts/cpp_cuda_check.py compile "$WORK" ${DRY[@]+"${DRY[@]}"}

for name in resnet50 bert; do
  step "run $name in C++ (--device $DEVICE: one cold call, then $RUNS timed calls; no PYTHON* in the environment)"
  start=$(date +%s.%N)
  env -u PYTHONPATH -u PYTHONHOME -u PYTHONSTARTUP "$BUILD/example/run_module" --device "$DEVICE" \
    "$WORK/model_$name.pt" "$WORK/inputs_$name.pt" "$WORK/cpp_$name.pt"
  end=$(date +%s.%N)
  "$PY" -c "print(round($end - $start, 3))" > "$WORK/cpp_$name.wall"  # cold start: load, move weights, one call
  env -u PYTHONPATH -u PYTHONHOME -u PYTHONSTARTUP "$BUILD/example/run_module" --device "$DEVICE" --runs "$RUNS" \
    "$WORK/model_$name.pt" "$WORK/inputs_$name.pt" | tee "$WORK/cpp_$name.log"
done

step "compare"
"$PY" scripts/cpp_cuda_check.py report "$WORK" | tee "$OUT/cpp_cuda.txt"
step "done: $OUT/cpp_cuda.txt"
