#include "triton_modules.h"

#include <dlfcn.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>

#include "torchkiln/engine.h"

namespace torchkiln {
namespace {

// cuLaunchKernelEx's launch description, laid out as cuda.h's CUlaunchConfig and CUlaunchAttribute (its id, padding
// to 8 bytes, then a 64-byte union of the attributes' values), declared with the one value used.
union LaunchAttributeValue {
  char pad[64];
  int programmatic_stream_serialization_allowed;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION's
  void* align;                                    // (the union holds pointers: 8-byte aligned)
};
struct LaunchAttribute {
  int id;  // CUlaunchAttributeID
  char pad[4];
  LaunchAttributeValue value;
};
struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
  void* stream;
  LaunchAttribute* attributes;
  unsigned num_attributes;
};
static_assert(sizeof(LaunchAttribute) == 72 && offsetof(LaunchAttribute, value) == 8, "cuda.h's CUlaunchAttribute");
static_assert(sizeof(LaunchConfig) == 56 && offsetof(LaunchConfig, stream) == 32 &&
                  offsetof(LaunchConfig, attributes) == 40 && offsetof(LaunchConfig, num_attributes) == 48,
              "cuda.h's CUlaunchConfig");
constexpr int kProgrammaticStreamSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

// The few driver entry points used, declared with opaque handles (CUmodule, CUfunction, CUstream are pointers;
// CUresult is an int, 0 for success).
struct Driver {
  int (*ctx_get_current)(void** context);
  int (*ctx_set_current)(void* context);
  int (*device_get)(int* device, int ordinal);
  int (*primary_ctx_retain)(void** context, int device);
  int (*module_load_data)(void** module, const void* image);
  int (*module_unload)(void* module);
  int (*module_get_function)(void** function, void* module, const char* name);
  int (*func_get_attribute)(int* value, int attribute, void* function);
  int (*func_set_attribute)(void* function, int attribute, int value);
  int (*launch_kernel)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shared, void* stream, void** params, void** extra);
  // null where the driver has none (before CUDA 11.8): chained launches are then launched plainly (`launch`)
  int (*launch_kernel_ex)(const LaunchConfig* config, void* function, void** params, void** extra);
  int (*get_error_string)(int error, const char** text);
};

constexpr int kSharedSizeBytes = 1;           // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
constexpr int kMaxDynamicSharedBytes = 8;     // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int64_t kDefaultSharedBytes = 49152;  // what a launch may use without opting in

const Driver& driver() {
  static const Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib, "torchkiln: a GPU tape needs the CUDA driver, and libcuda.so.1 does not open: ", dlerror());
    auto find = [&](const char* name) {
      void* symbol = dlsym(lib, name);
      TORCH_CHECK(symbol, "torchkiln: the CUDA driver has no ", name);
      return symbol;
    };
    Driver out;
    out.ctx_get_current = reinterpret_cast<decltype(out.ctx_get_current)>(find("cuCtxGetCurrent"));
    out.ctx_set_current = reinterpret_cast<decltype(out.ctx_set_current)>(find("cuCtxSetCurrent"));
    out.device_get = reinterpret_cast<decltype(out.device_get)>(find("cuDeviceGet"));
    out.primary_ctx_retain = reinterpret_cast<decltype(out.primary_ctx_retain)>(find("cuDevicePrimaryCtxRetain"));
    out.module_load_data = reinterpret_cast<decltype(out.module_load_data)>(find("cuModuleLoadData"));
    out.module_unload = reinterpret_cast<decltype(out.module_unload)>(find("cuModuleUnload"));
    out.module_get_function = reinterpret_cast<decltype(out.module_get_function)>(find("cuModuleGetFunction"));
    out.func_get_attribute = reinterpret_cast<decltype(out.func_get_attribute)>(find("cuFuncGetAttribute"));
    out.func_set_attribute = reinterpret_cast<decltype(out.func_set_attribute)>(find("cuFuncSetAttribute"));
    out.launch_kernel = reinterpret_cast<decltype(out.launch_kernel)>(find("cuLaunchKernel"));
    out.launch_kernel_ex = reinterpret_cast<decltype(out.launch_kernel_ex)>(dlsym(lib, "cuLaunchKernelEx"));
    out.get_error_string = reinterpret_cast<decltype(out.get_error_string)>(find("cuGetErrorString"));
    return out;
  }();
  return d;
}

std::string error_text(int code) {
  const char* text = nullptr;
  driver().get_error_string(code, &text);
  return text ? text : "CUDA driver error " + std::to_string(code);
}

// The device's primary context made current on this thread where none is (as Triton's launcher does): the runtime
// API binds it lazily, so a thread that made no runtime call yet has none for the driver API.
void ensure_context(int ordinal, const std::string& where) {
  const Driver& cu = driver();
  void* context = nullptr;
  cu.ctx_get_current(&context);
  if (context) return;
  int device = 0;
  int code = cu.device_get(&device, ordinal);
  if (code == 0) code = cu.primary_ctx_retain(&context, device);
  if (code == 0) code = cu.ctx_set_current(context);
  TORCH_CHECK(code == 0, where, ": no CUDA context for device ", ordinal, ": ", error_text(code));
}

// The bytes a scalar param takes in the kernel's parameter buffer.
size_t scalar_size(const std::string& type) {
  static const std::map<std::string, size_t> sizes = {
      {"i1", 1},  {"i8", 1},  {"u1", 1},  {"u8", 1},   {"i16", 2},  {"u16", 2},  {"fp16", 2},
      {"bf16", 2}, {"i32", 4}, {"u32", 4}, {"fp32", 4}, {"i64", 8}, {"u64", 8}, {"fp64", 8}};
  return sizes.at(type);
}

// A double to fp16 bits rounded once, to nearest even (Python's PyFloat_Pack2, which Triton packs with): through a
// float rounded to odd, which then rounds to nearest at half's 11 bits as the double itself would.
uint16_t half_bits(double d) {
  float f = static_cast<float>(d);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (static_cast<double>(f) != d && std::isfinite(f) && !(bits & 1))
    f = std::nextafter(f, d > f ? INFINITY : -INFINITY);
  return c10::Half(f).x;
}

// A scalar param's bytes (little-endian, as the kernel reads them): Triton's packing of ints and floats.
uint64_t scalar_bits(const std::string& type, const TapeArg& arg, const std::string& what) {
  bool real = type.rfind("fp", 0) == 0 || type == "bf16";
  if (arg.kind == TapeArg::Kind::BigInt || (!real && arg.kind != TapeArg::Kind::Int))
    format_error(what + ": a " + type + " param is given a number it cannot take");
  uint64_t out = 0;
  if (!real) {
    std::memcpy(&out, &arg.i, scalar_size(type));  // the low bytes: the value modulo 2^bits
    return out;
  }
  double d = arg.kind == TapeArg::Kind::Float ? arg.f : static_cast<double>(arg.i);
  float f = static_cast<float>(d);
  uint32_t f_bits;
  std::memcpy(&f_bits, &f, 4);
  if (type == "fp16") out = half_bits(d);
  if (type == "bf16") out = f_bits >> 16;  // Triton truncates the float's bits
  if (type == "fp32") out = f_bits;
  if (type == "fp64") std::memcpy(&out, &d, 8);
  return out;
}

}  // namespace

TritonModules::TritonModules(const std::vector<TapeKernel>& kernels, const at::Device& device,
                             const std::string& where)
    : kernels_(kernels), where_(where), device_(device.index()) {
  const Driver& cu = driver();
  ensure_context(device_, where);
  for (const TapeKernel& k : kernels) {
    std::string what = where + ": kernel '" + k.name + "'";
    void *module = nullptr, *function = nullptr;
    int code = cu.module_load_data(&module, k.cubin.data());
    if (code != 0) format_error(what + ": its cubin does not load: " + error_text(code));
    modules_.push_back(module);
    code = cu.module_get_function(&function, module, k.name.c_str());
    if (code != 0) format_error(what + ": its cubin has no such function: " + error_text(code));
    if (k.shared > kDefaultSharedBytes) {  // more dynamic shared memory than a launch gets unasked (Triton's loader)
      int fixed = 0;
      cu.func_get_attribute(&fixed, kSharedSizeBytes, function);
      code = cu.func_set_attribute(function, kMaxDynamicSharedBytes, static_cast<int>(k.shared));
      if (code != 0)
        format_error(what + ": " + std::to_string(k.shared) + " bytes of dynamic shared memory (and " +
                     std::to_string(fixed) + " static) do not fit this GPU: " + error_text(code));
    }
    functions_.push_back(function);
  }
}

TritonModules::~TritonModules() {
  for (void* module : modules_) driver().module_unload(module);  // at exit the driver may be gone: nothing to do then
}

void TritonModules::launch(size_t k, const std::array<int64_t, 3>& grid, const std::vector<TapeArg>& args,
                           const std::vector<at::Tensor>& values, void* stream, bool pdl,
                           const std::string& what) const {
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return;
  ensure_context(device_, where_);
  const TapeKernel& kernel = kernels_[k];
  // One 8-byte slot per argument, then Triton's global and profile scratch pointers (null: tapes never use them).
  std::vector<uint64_t> slots(args.size() + 2, 0);
  std::vector<void*> params;
  for (size_t j = 0; j < args.size(); ++j) {
    const std::string& type = kernel.params[j];
    if (type[0] == '*') {
      const at::Tensor& t = values[args[j].i];
      if (!t.defined()) format_error(what + ": a pointer param is given an undefined tensor");
      slots[j] = reinterpret_cast<uint64_t>(t.data_ptr());
    } else {
      slots[j] = scalar_bits(type, args[j], what);
    }
  }
  for (uint64_t& slot : slots) params.push_back(&slot);
  const Driver& cu = driver();
  unsigned block = static_cast<unsigned>(32 * kernel.num_warps), shared = static_cast<unsigned>(kernel.shared);
  int code;
  if (pdl && cu.launch_kernel_ex) {  // as Triton's launcher launches a kernel compiled with launch_pdl
    LaunchAttribute chained{};
    chained.id = kProgrammaticStreamSerialization;
    chained.value.programmatic_stream_serialization_allowed = 1;
    LaunchConfig config{static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2]),
                        block, 1, 1, shared, stream, &chained, 1};
    code = cu.launch_kernel_ex(&config, functions_[k], params.data(), nullptr);
  } else {
    // A chained kernel launched plainly (a driver without cuLaunchKernelEx) starts once the kernel before it has
    // finished, so its wait (griddepcontrol.wait) returns at once: the same results, only not overlapped.
    code = cu.launch_kernel(functions_[k], grid[0], grid[1], grid[2], block, 1, 1, shared, stream, params.data(),
                            nullptr);
  }
  TORCH_CHECK(code == 0, where_, ": ", what, ": kernel '", kernel.name, "' does not launch: ", error_text(code));
}

}  // namespace torchkiln
