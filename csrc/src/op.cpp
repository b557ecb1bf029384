// torchkiln::execute_engine and torchkiln::fresh_copy in C++, with the schemas runtime/execute_op.py defines, so
// that a compiled module runs in a process that has loaded this library and has no Python.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

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
  std::shared_ptr<Engine> engine;
  std::string fits;  // the module signature the engine was found to fit (checked once, not on every call)
};

// The engine a blob holds, refused (EngineFormatError) where `expected` names another engine signature.
std::shared_ptr<Engine> engine_from_blob(const at::Tensor& blob, const std::string& expected) {
  static std::mutex lock;
  static std::unordered_map<const c10::TensorImpl*, Loaded> cache;
  check_blob(blob);
  std::tuple<const void*, int64_t, int64_t> key{blob.data_ptr(), blob.is_inference() ? -1 : (int64_t)blob._version(),
                                                blob.numel()};
  std::lock_guard<std::mutex> guard(lock);
  auto found = cache.find(blob.unsafeGetTensorImpl());
  if (found == cache.end() || found->second.blob.expired() || found->second.key != key) {
    for (auto it = cache.begin(); it != cache.end();)  // forget the engines of blobs that are gone
      it = it->second.blob.expired() ? cache.erase(it) : std::next(it);
    at::Tensor bytes = blob.detach().cpu().contiguous();
    auto engine = Engine::deserialize(bytes.data_ptr<uint8_t>(), bytes.numel());
    found = cache.insert_or_assign(blob.unsafeGetTensorImpl(),
                                   Loaded{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                                              blob.getIntrusivePtr()),
                                          key, engine, ""})
                .first;
  }
  Loaded& loaded = found->second;
  if (!expected.empty() && expected != loaded.fits) {
    if (!loaded.engine->fits(expected))
      format_error("engine '" + loaded.engine->name + "' does not fit this module: the module expects '" + expected +
                   "', the engine has '" + loaded.engine->signature() + "'");
    loaded.fits = expected;
  }
  return loaded.engine;
}

std::vector<at::Tensor> execute_engine(const std::vector<at::Tensor>& inputs, const at::Tensor& blob,
                                       c10::string_view signature) {
  return engine_from_blob(blob, std::string(signature))->execute(inputs);
}

std::vector<at::Tensor> execute_below_autograd(const std::vector<at::Tensor>& inputs, const at::Tensor& blob,
                                               c10::string_view signature) {
  at::AutoDispatchBelowADInplaceOrView guard;  // engines are inference-only: outputs do not require grad
  return execute_engine(inputs, blob, signature);
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
}
