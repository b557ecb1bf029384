// A stand-in for the CUDA driver (built as fake_driver/libcuda.so.1) that prints the calls a tape's kernels make, so
// that tests/test_cpp_tape.py checks the launches' packing on a machine with no GPU. A "cubin" here is the decimal
// number of parameters its kernel takes (two of them Triton's scratch pointers).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
int num_params = 0;
int context = 0;
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
  for (int k = 0; k < num_params; ++k) {
    uint64_t slot;
    std::memcpy(&slot, params[k], 8);
    std::printf(" %016llx", static_cast<unsigned long long>(slot));
  }
  std::printf("\n");
  return 0;
}
int cuGetErrorString(int, const char** text) {
  *text = "fake";
  return 0;
}
}
