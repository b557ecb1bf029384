// torchkiln::execute_engine and torchkiln::fresh_copy in C++, with the schemas runtime/execute_op.py defines, so
// that a compiled module runs in a process that has loaded this library and has no Python.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <atomic>
#include <iostream>
#include <locale>
#include <limits>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "kinds.h"
#include "torchkiln/engine.h"

namespace torchkiln {
namespace {

void check_blob(const at::Tensor& blob) {  // execute_op.check_blob
  std::string got;
  if (!blob.defined())
    got = "None";
  else if (blob.is_quantized())
    got = "a quantized tensor (" + std::string(c10::toString(blob.scalar_type())) + ")";
  else if (blob.layout() != at::kStrided || blob.is_nested())
    got = "a non-strided tensor";
  else if (blob.scalar_type() != at::kByte)
    got = "a torch." + kinds().dtype_name(blob.scalar_type()) + " tensor";
  else if (blob.device().is_meta())
    got =
        "a tensor on the meta device, which holds no bytes (was the module loaded "
        "with map_location='meta'?)";
  else
    return;
  format_error("an engine attribute must be a uint8 tensor of engine bytes, got " + got);
}

// An engine is kept while its blob lives (as the Python runtime keeps it on the blob) and reloaded when the blob's
// data, version counter (an in-place write) or size changes.
struct Loaded {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> blob;
  std::tuple<const void*, int64_t, int64_t> key;
  std::shared_ptr<Engine> engine;  // hosted: null where the package runs every call
  std::string fits;  // the module signature the engine was found to fit (checked once, not on every call)
};

// (a Tensor[] as a TensorList: the dispatcher takes dispatch keys from the tensors of a TensorList, not of a vector)
using Signature = std::vector<at::Tensor>(at::TensorList, const at::Tensor&, c10::string_view);

// The package's kernel (torchkiln::execute_engine_python) where a Python process hosts this library: runtime/
// execute_op.py defines it when this library defined the ops first. Looked up until found.
std::optional<c10::TypedOperatorHandle<Signature>> package_kernel() {
  static std::atomic<bool> found{false};
  static std::optional<c10::TypedOperatorHandle<Signature>> handle;
  if (found.load(std::memory_order_acquire)) return handle;
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  if (!handle) {
    auto op = c10::Dispatcher::singleton().findSchema({"torchkiln::execute_engine_python", ""});
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) return std::nullopt;
    handle = op->typed<Signature>();
    found.store(true, std::memory_order_release);
  }
  return handle;
}

// Calls that a hosted library hands to the package even where a tape fits (its step profiler times the package's
// runner: torchkiln::hold_tapes).
std::atomic<int64_t> tapes_held{0};

// The engine a blob holds, refused (EngineFormatError) where `expected` names another engine signature. Hosted
// (`device`, the call's, given): the engine whose fitting calls run here, or null where the package runs them all
// (the blob names no tape, the engine has dynamic shapes or no tape for the device of its first call here, its bytes
// or signature are refused: the package then raises its own error).
std::mutex cache_lock;
std::unordered_map<const c10::TensorImpl*, Loaded> cache;  // by blob

std::shared_ptr<Engine> engine_from_blob(const at::Tensor& blob, c10::string_view expected,
                                         const at::Device* device = nullptr) {
  const bool hosted = device != nullptr;
  if (hosted) {
    if (!blob.defined() || blob.scalar_type() != at::kByte || blob.layout() != at::kStrided || blob.is_nested() ||
        blob.is_quantized() || !blob.device().is_cpu())
      return nullptr;
  } else {
    check_blob(blob);
  }
  std::tuple<const void*, int64_t, int64_t> key{blob.data_ptr(), blob.is_inference() ? -1 : (int64_t)blob._version(),
                                                blob.numel()};
  std::lock_guard<std::mutex> guard(cache_lock);
  for (auto it = cache.begin(); it != cache.end();)  // forget the engines of blobs that are gone (a few: each call)
    it = it->second.blob.expired() ? cache.erase(it) : std::next(it);
  auto found = cache.find(blob.unsafeGetTensorImpl());
  if (found == cache.end() || found->second.key != key) {
    at::Tensor bytes = blob.detach().contiguous();
    std::shared_ptr<Engine> engine;
    if (!hosted) {
      engine = Engine::deserialize(bytes.data_ptr<uint8_t>(), bytes.numel());
    } else if (holds_tapes(bytes.data_ptr<uint8_t>(), bytes.numel())) {
      try {
        engine = Engine::deserialize(bytes.data_ptr<uint8_t>(), bytes.numel());
        for (const Binding& b : engine->bindings)  // (its other shapes would hold the weights twice: once here)
          if (b.min_shape != b.max_shape) engine = nullptr;
        // (a call on a device of another kind is the package's to refuse: it decides nothing here)
        if (engine && device->type() == c10::Device(engine->device_type).type() && !engine->has_tape_for(*device))
          engine = nullptr;
      } catch (const c10::Error&) {
      }
    }
    found = cache.insert_or_assign(blob.unsafeGetTensorImpl(),
                                   Loaded{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                                              blob.getIntrusivePtr()),
                                          key, engine, ""})
                .first;
  }
  Loaded& loaded = found->second;
  if (loaded.engine && !expected.empty() && expected != c10::string_view(loaded.fits)) {
    const std::string wanted(expected);
    if (hosted ? wanted != loaded.engine->signature() : !loaded.engine->fits(wanted)) {
      if (hosted) return nullptr;  // (exactly the package's signature check, an engine of static shapes)
      format_error("engine '" + loaded.engine->name + "' does not fit this module: the module expects '" +
                   wanted + "', the engine has '" + loaded.engine->signature() + "'");
    }
    loaded.fits = wanted;
  }
  return loaded.engine;
}

std::vector<at::Tensor> execute_engine(at::TensorList inputs, const at::Tensor& blob, c10::string_view signature) {
  if (auto package = package_kernel()) {
    // Hosted by a Python process: a call that a tape fits runs here, every other one (and every error) in the package.
    if (tapes_held.load(std::memory_order_relaxed) == 0 && !inputs.empty()) {
      const at::Device device = inputs[0].device();
      if (auto engine = engine_from_blob(blob, signature, &device)) {
        try {
          if (auto outputs = engine->run_fitting_tape(inputs)) return *std::move(outputs);
        } catch (const c10::Error& e) {  // the tape cannot run here: the package runs the engine from now on
          TORCH_WARN("torchkiln: engine '", engine->name, "' runs on the Python runtime, not its tape: ",
                     e.what_without_backtrace());
          std::lock_guard<std::mutex> guard(cache_lock);
          auto found = cache.find(blob.unsafeGetTensorImpl());
          if (found != cache.end()) found->second.engine = nullptr;
        }
      }
    }
    return package->call(inputs, blob, signature);
  }
  return engine_from_blob(blob, signature)->execute(inputs.vec());
}

bool holds_data(const at::Tensor& x) {  // a plain tensor on a device with memory (no meta, fake or other subclass)
  return !x.defined() || (!x.is_meta() && !x.key_set().has(c10::DispatchKey::Python));
}

std::vector<at::Tensor> execute_below_autograd(at::TensorList inputs, const at::Tensor& blob,
                                               c10::string_view signature) {
  at::AutoDispatchBelowADInplaceOrView guard;  // engines are inference-only: outputs do not require grad
  bool plain = holds_data(blob);
  for (const at::Tensor& x : inputs) plain = plain && holds_data(x);
  if (plain) return execute_engine(inputs, blob, signature);
  // meta, fake and other tensor subclasses go below autograd to their own kernels
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchkiln::execute_engine", "").typed<Signature>();
  return op.call(inputs, blob, signature);
}

int64_t hold_tapes(int64_t delta) { return tapes_held += delta; }

// Whether this library's C++ standard library is the process's. A toolchain that links parts of libstdc++ into the
// library statically (a gcc-toolset's libstdc++_nonshared.a) gives it a second std::locale, which crashes the first
// number it formats in a process whose own libstdc++ came first: a Python process that loads it. (A C++ program
// binds its own calls to the library's copy.)
bool shares_standard_library() {
  if (dlsym(RTLD_DEFAULT, "Py_IsInitialized") == nullptr) return true;
  Dl_info self, found;
  if (!dladdr(reinterpret_cast<void*>(&shares_standard_library), &self) || !self.dli_fname) return true;
  void* handle = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  void* locale = handle ? dlsym(handle, "_ZNSt6locale7classicEv") : nullptr;  // searched from this library on
  bool own = locale && dladdr(locale, &found) && found.dli_fname && std::string(found.dli_fname) == self.dli_fname;
  if (handle) dlclose(handle);
  return !own;
}

at::Tensor fresh_copy(const at::Tensor& self) { return self.clone(); }

// torchkiln's ops that a compiled module's PyTorch blocks may call (torchkiln/ops.py).
at::Tensor attn_bias_from_attn_mask(const at::Tensor& mask) {
  if (mask.scalar_type() != at::kBool) return mask.clone();
  return at::zeros(mask.sizes(), mask.options().dtype(at::kFloat))
      .masked_fill(at::logical_not(mask), -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace torchkiln

// A fragment, not the namespace's one TORCH_LIBRARY, so that a Python process may hold both this library and the
// torchkiln package in either order. Where the package registered the ops first, they keep its kernels (its
// onnxruntime and cuda backends run them there); where this library comes first, the package overrides the kernels
// with its own when it is imported (runtime/execute_op.py).
TORCH_LIBRARY_FRAGMENT(torchkiln, m) {
  if (c10::Dispatcher::singleton().findSchema({"torchkiln::execute_engine", ""}).has_value()) return;
  if (!torchkiln::shares_standard_library()) {  // the package's kernels run every call (runtime/native.py warns)
    std::cerr << "torchkiln: libtorchkiln_runtime.so was built with a C++ standard library other than this "
                 "process's, so it registers nothing here; build it with the compiler whose libstdc++ the process "
                 "loads (docs/deployment.md)\n";
    return;
  }
  m.def("execute_engine(Tensor[] inputs, Tensor engine, str signature='') -> Tensor[]");
  m.def(torch::schema("fresh_copy(Tensor self) -> Tensor", c10::AliasAnalysisKind::CONSERVATIVE));
  m.def("const(Tensor self) -> Tensor");
  m.def("attn_bias_from_attn_mask(Tensor attn_mask) -> Tensor");
  const auto composite = c10::DispatchKey::CompositeExplicitAutograd;
  m.impl("execute_engine", torch::dispatch(composite, TORCH_FN(torchkiln::execute_engine)));
  m.impl("fresh_copy", torch::dispatch(composite, TORCH_FN(torchkiln::fresh_copy)));
  m.impl("const", torch::dispatch(composite, TORCH_FN(torchkiln::fresh_copy)));
  m.impl("attn_bias_from_attn_mask", torch::dispatch(composite, TORCH_FN(torchkiln::attn_bias_from_attn_mask)));
  m.impl("execute_engine", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN(torchkiln::execute_below_autograd)));
  // +1 while a Python process's step profiler runs (every call then goes to the package), -1 after; the new count
  m.def("hold_tapes(int delta) -> int", TORCH_FN(torchkiln::hold_tapes));
}
