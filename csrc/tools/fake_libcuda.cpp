// A stand-in for the CUDA driver (built as fake_driver/libcuda.so.1) that prints the calls a tape's kernels make, so
// that tests/test_cpp_tape.py checks the launches' packing on a machine with no GPU. A "cubin" here is the decimal
// number of parameters its kernel takes (two of them Triton's scratch pointers). Built with FAKE_DRIVER_BEFORE_11_8
// (as fake_driver_before_11_8/libcuda.so.1) it has no cuLaunchKernelEx, as drivers before CUDA 11.8 have none.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
int num_params = 0;
int context = 0;

void print_params(void** params) {
  for (int k = 0; k < num_params; ++k) {
    uint64_t slot;
    std::memcpy(&slot, params[k], 8);
    std::printf(" %016llx", static_cast<unsigned long long>(slot));
  }
  std::printf("\n");
}

template <typename T>
T at(const void* base, size_t offset) {
  T value;
  std::memcpy(&value, static_cast<const char*>(base) + offset, sizeof(T));
  return value;
}
}  // namespace

extern "C" {
int cuCtxGetCurrent(void** ctx) {
  *ctx = context ? &context : nullptr;
  return 0;
}
int cuCtxSetCurrent(void* ctx) {
  context = ctx != nullptr;
  std::printf("cuCtxSetCurrent\n");
  return 0;
}
int cuDeviceGet(int* device, int ordinal) {
  *device = ordinal;
  return 0;
}
int cuDevicePrimaryCtxRetain(void** ctx, int) {
  *ctx = &context;
  return 0;
}
int cuModuleLoadData(void** module, const void* image) {
  num_params = std::atoi(static_cast<const char*>(image));
  *module = &num_params;
  return 0;
}
int cuModuleUnload(void*) { return 0; }
int cuModuleGetFunction(void** function, void* module, const char* name) {
  std::printf("cuModuleGetFunction %s\n", name);
  *function = module;
  return 0;
}
int cuFuncGetAttribute(int* value, int attribute, void*) {
  *value = 0;
  std::printf("cuFuncGetAttribute %d\n", attribute);
  return 0;
}
int cuFuncSetAttribute(void*, int attribute, int value) {
  std::printf("cuFuncSetAttribute %d %d\n", attribute, value);
  return 0;
}
int cuLaunchKernel(void*, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* stream, void** params, void** extra) {
  std::printf("cuLaunchKernel %u %u %u %u %u %u %u %p %p", gx, gy, gz, bx, by, bz, shared, stream, (void*)extra);
  print_params(params);
  return 0;
}
#ifndef FAKE_DRIVER_BEFORE_11_8
// The config read at cuda.h's offsets (CUlaunchConfig: seven unsigned dims and sizes, then hStream at 32, attrs at
// 40, numAttrs at 48; CUlaunchAttribute: 72 bytes, its id at 0 and its value union at 8), not through a shared
// declaration, so that a wrong layout in the runtime shows: each attribute is printed as id:first int of its value.
int cuLaunchKernelEx(const void* config, void*, void** params, void** extra) {
  std::printf("cuLaunchKernelEx");
  for (size_t k = 0; k < 7; ++k) std::printf(" %u", at<unsigned>(config, 4 * k));
  std::printf(" %p %p", at<void*>(config, 32), (void*)extra);
  const char* attributes = at<const char*>(config, 40);
  unsigned count = at<unsigned>(config, 48);
  std::printf(" attributes %u", count);
  for (unsigned k = 0; k < count; ++k)
    std::printf(" %d:%d", at<int>(attributes, 72 * k), at<int>(attributes, 72 * k + 8));
  print_params(params);
  return 0;
}
#endif
int cuGetErrorString(int, const char** text) {
  *text = "fake";
  return 0;
}
}
