// Replaying a tape (docs/tape_format.md, "Running a tape"): input buffers, the prologue once, then the body per call:
// its operators through the dispatcher (arguments typed by their schemas), its kernels through the CUDA driver, and
// on a GPU (CUDA builds) the body captured once as a CUDA graph and replayed.
#include <ATen/ScalarOps.h>
#include <ATen/ops/_foreach_copy.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

#include "tape.h"
#include "torchkiln/engine.h"
#include "triton_modules.h"

#ifdef TORCHKILN_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace torchkiln {

void wait_for_last_call(std::optional<c10::Stream>& last, const at::Device& device) {
  c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
  if (last && *last != stream) {
    c10::Event done(c10::DeviceType::CUDA);
    done.record(*last);
    done.block(stream);
  }
  last = stream;
}

void copy_inputs(at::TensorList buffers, at::TensorList inputs) {
  if (inputs.size() > 1)
    at::_foreach_copy_(buffers.slice(0, inputs.size()), inputs);
  else if (!inputs.empty())
    buffers[0].copy_(inputs[0]);
}

bool tape_log() {
  const char* log = std::getenv("TORCHKILN_TAPE_LOG");
  return log && std::string(log) == "1";
}

#ifdef TORCHKILN_CUDA
std::optional<std::string> capture_aside(at::cuda::CUDAGraph& graph, at::cuda::MempoolId_t pool,
                                         const at::Device& device, const std::function<void()>& warm,
                                         const std::function<void()>& body) {
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  c10::Event before(c10::DeviceType::CUDA), after(c10::DeviceType::CUDA);  // (CUDAEvent moved between releases)
  before.record(current);
  before.block(side);
  std::optional<std::string> failed;
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    warm();
    graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      body();
      graph.capture_end();
    } catch (const c10::Error& e) {
      try {
        graph.capture_end();  // the side stream leaves capture mode; the broken capture is dropped by the caller
      } catch (...) {
      }
      failed = e.what_without_backtrace();
    }
  }
  after.record(side);
  after.block(current);
  return failed;
}
#endif

struct TapeRunner::Graph {
#ifdef TORCHKILN_CUDA
  at::cuda::CUDAGraph graph;
#endif
};

namespace {

void reads_of(const TapeArg& arg, std::vector<int64_t>& out) {
  if (arg.kind == TapeArg::Kind::Tensor) out.push_back(arg.i);
  for (const TapeArg& a : arg.list) reads_of(a, out);
}

std::vector<int64_t> reads_of(const TapeInstruction& instruction) {
  std::vector<int64_t> out;
  for (const TapeArg& a : instruction.args) reads_of(a, out);
  for (const auto& kv : instruction.kwargs) reads_of(kv.second, out);
  return out;
}

// A number given for a Tensor argument: a 0-dim CPU tensor marked a wrapped number, so that type promotion treats it
// as a Python scalar, as torch's Python binding converts one (`x * 0.5` reaches the dispatcher as aten::mul.Tensor).
at::Tensor wrapped_number(const c10::Scalar& value) {
  at::Tensor t = at::scalar_to_tensor(value);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// Steps for `instructions`, each freeing the values written among them whose last reader (or, unread, whose writer)
// it is, but for those `keep` marks.
std::vector<TapeRunner::Step> steps_of(const std::vector<TapeInstruction>& instructions, const std::string& part,
                                       const std::vector<bool>& keep) {
  std::vector<int64_t> last(keep.size(), -1);
  std::vector<bool> written(keep.size(), false);
  for (size_t k = 0; k < instructions.size(); ++k) {
    for (int64_t v : instructions[k].out)
      if (v >= 0) written[v] = true, last[v] = k;
    for (int64_t v : reads_of(instructions[k])) last[v] = k;
  }
  std::vector<TapeRunner::Step> steps;
  for (size_t k = 0; k < instructions.size(); ++k)
    steps.push_back({&instructions[k], part + " instruction " + std::to_string(k), std::nullopt, {}});
  for (size_t v = 0; v < keep.size(); ++v)
    if (written[v] && !keep[v]) steps[last[v]].frees.push_back(v);
  return steps;
}

}  // namespace

TapeRunner::TapeRunner(std::shared_ptr<const Tape> tape, const Network& network, const at::Device& device,
                       bool capture, std::shared_ptr<SharedValues> shared)
    : tape_(std::move(tape)), network_(network), device_(device), capture_(capture), shared_(std::move(shared)) {
  // The prologue's values the body reads stay (as do the outputs); a body's value lives until its last reader.
  std::vector<bool> outputs(tape_->num_values, false), body_reads(tape_->num_values, false);
  for (int64_t v : tape_->outputs) outputs[v] = body_reads[v] = true;
  for (const TapeInstruction& instruction : tape_->body)
    for (int64_t v : reads_of(instruction)) body_reads[v] = true;
  prologue_ = steps_of(tape_->prologue, "prologue", body_reads);
  kept_ = body_reads;
  body_ = steps_of(tape_->body, "body", outputs);
}

TapeRunner::~TapeRunner() = default;

namespace {

// An argument as text for a shared value's key, a tensor by its value's key.
void key_text(const TapeArg& arg, const std::vector<std::string>& keys, std::string& out) {
  using K = TapeArg::Kind;
  out += std::to_string(static_cast<int>(arg.kind)) + ":";
  switch (arg.kind) {
    case K::Tensor:
      out += "{" + keys[arg.i] + "}";
      break;
    case K::Float: {  // its bits: two doubles are one key only where they are the same double
      uint64_t bits;
      std::memcpy(&bits, &arg.f, sizeof bits);
      out += std::to_string(bits);
      break;
    }
    case K::Str:
    case K::BigInt:
      out += std::to_string(arg.s.size()) + "'" + arg.s;
      break;
    case K::List:
      out += "[";
      for (const TapeArg& a : arg.list) key_text(a, keys, out), out += ",";
      out += "]";
      break;
    default:
      out += std::to_string(arg.b) + "," + std::to_string(arg.i);
  }
  out += ";";
}

}  // namespace

void TapeRunner::share_keys() {
  // Keyed: the weights, and the prologue's operators whose tensors are all keyed and whose schema writes nothing, but
  // for those whose output's values are not their inputs' (`empty_like`, `new_zeros`: a buffer for a kernel to write).
  // Nothing is shared where an operator that writes reads a keyed value (the Python runner never does).
  std::vector<std::string> keys(tape_->num_values);
  for (Step& step : prologue_) {
    const TapeInstruction& ins = *step.instruction;
    if (ins.kind == TapeInstruction::Kind::Weight) {
      keys[ins.out[0]] = "w" + std::to_string(ins.index) + "/" + ins.name;
      continue;
    }
    if (ins.kind != TapeInstruction::Kind::Op || step.op->schema().is_mutable()) continue;
    const std::string& base = step.op->schema().name();
    if (base.rfind("aten::new_", 0) == 0 || (base.size() > 5 && base.compare(base.size() - 5, 5, "_like") == 0))
      continue;
    std::vector<int64_t> reads = reads_of(ins);
    bool all_keyed = !reads.empty();
    for (int64_t v : reads) all_keyed = all_keyed && !keys[v].empty();
    if (!all_keyed) continue;
    std::string key = ins.name + "." + ins.overload + "(";
    for (const TapeArg& a : ins.args) key_text(a, keys, key);
    for (const auto& kv : ins.kwargs) key += kv.first + "=", key_text(kv.second, keys, key);
    key += ")";
    for (size_t j = 0; j < ins.out.size(); ++j)
      if (ins.out[j] >= 0) keys[ins.out[j]] = key + "#" + std::to_string(j);
    step.shared = std::move(key);
  }
  for (auto* steps : {&prologue_, &body_})
    for (const Step& step : *steps)
      if (step.instruction->kind == TapeInstruction::Kind::Op && step.op->schema().is_mutable())
        for (int64_t v : reads_of(*step.instruction))
          if (!keys[v].empty()) {
            for (Step& s : prologue_) s.shared.clear();
            return;
          }
}

bool TapeRunner::reuse(const Step& step) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  auto found = shared_->made.find(step.shared);
  if (found == shared_->made.end()) return false;
  const std::vector<int64_t>& out = step.instruction->out;
  for (size_t j = 0; j < out.size() && j < found->second.outputs.size(); ++j)
    if (out[j] >= 0) values_[out[j]] = found->second.outputs[j];
  if (std::optional<c10::Stream> made_on = found->second.stream)  // a GPU's: this stream waits for that one's work
    wait_for_last_call(made_on, device_);
  ++reused_;
  return true;
}

void TapeRunner::keep_shared(const Step& step) {
  SharedValues::Made made;
  for (int64_t v : step.instruction->out) made.outputs.push_back(v >= 0 ? values_[v] : at::Tensor());
  if (device_.is_cuda()) made.stream = c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_);
  made_.emplace_back(step.shared, std::move(made));
}

void TapeRunner::share_made() {
  // Of what this prologue made under a key, what its body reads stays for the other tapes: the values it keeps, and
  // those whose memory a kept value views (a weight placed, then transposed). An intermediate is made again, and freed.
  std::set<const void*> kept;
  for (size_t v = 0; v < values_.size(); ++v)
    if (kept_[v] && values_[v].defined() && values_[v].has_storage())
      kept.insert(values_[v].storage().data_ptr().get());
  std::lock_guard<std::mutex> lock(shared_->mutex);
  for (auto& [key, made] : made_) {
    bool alive = true;
    for (const at::Tensor& t : made.outputs)
      alive = alive && (!t.defined() || (t.has_storage() && kept.count(t.storage().data_ptr().get())));
    if (alive) shared_->made.emplace(key, std::move(made));
  }
  made_.clear();
}

c10::IValue TapeRunner::argument(const TapeArg& arg, const c10::TypePtr& type, const std::string& what) const {
  using K = TapeArg::Kind;
  auto refuse = [&]() -> c10::IValue {
    format_error(tape_->where + ": " + what + ": a " + type->str() + " argument cannot take what the tape gives");
  };
  if (arg.kind == K::None) return type->kind() == c10::TypeKind::OptionalType ? c10::IValue() : refuse();
  switch (type->kind()) {
    case c10::TypeKind::OptionalType:
      return argument(arg, type->expectRef<c10::OptionalType>().getElementType(), what);
    case c10::TypeKind::TensorType:  // a number there is a wrapped one, as torch's Python binding makes it
      if (arg.kind == K::Tensor) return c10::IValue(values_[arg.i]);
      if (arg.kind == K::Float) return c10::IValue(wrapped_number(c10::Scalar(arg.f)));
      if (arg.kind == K::Int) return c10::IValue(wrapped_number(c10::Scalar(arg.i)));
      return arg.kind == K::Bool ? c10::IValue(wrapped_number(c10::Scalar(arg.b))) : refuse();
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:  // these enums are ints on the stack
      if (arg.kind == K::Int || arg.kind == K::Dtype || arg.kind == K::Layout || arg.kind == K::MemoryFormat)
        return c10::IValue(arg.i);
      return arg.kind == K::Bool ? c10::IValue(int64_t(arg.b)) : refuse();
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      if (arg.kind == K::Float) return c10::IValue(arg.f);
      return arg.kind == K::Int ? c10::IValue(static_cast<double>(arg.i)) : refuse();
    case c10::TypeKind::NumberType:  // a Scalar: an int where the JSON wrote an integer
      if (arg.kind == K::Float) return c10::IValue(arg.f);
      if (arg.kind == K::Int) return c10::IValue(arg.i);
      return arg.kind == K::Bool ? c10::IValue(arg.b) : refuse();
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      return arg.kind == K::Bool ? c10::IValue(arg.b) : refuse();
    case c10::TypeKind::StringType:
      return arg.kind == K::Str ? c10::IValue(arg.s) : refuse();
    case c10::TypeKind::DeviceObjType:
      return arg.kind == K::Device ? c10::IValue(arg.b ? device_ : at::Device(at::kCPU)) : refuse();
    case c10::TypeKind::ListType:
      break;
    default:
      return refuse();
  }
  if (arg.kind != K::List) return refuse();
  const c10::TypePtr& element = type->expectRef<c10::ListType>().getElementType();
  // Typed lists, as the kernels' unboxing wants them (an int[] is an IntList, a Tensor?[] a list of optionals).
  switch (element->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: {
      c10::List<int64_t> out;
      for (const TapeArg& a : arg.list) out.push_back(argument(a, element, what).toInt());
      return out;
    }
    case c10::TypeKind::FloatType: {
      c10::List<double> out;
      for (const TapeArg& a : arg.list) out.push_back(argument(a, element, what).toDouble());
      return out;
    }
    case c10::TypeKind::BoolType: {
      c10::List<bool> out;
      for (const TapeArg& a : arg.list) out.push_back(argument(a, element, what).toBool());
      return out;
    }
    case c10::TypeKind::TensorType: {
      c10::List<at::Tensor> out;
      for (const TapeArg& a : arg.list) out.push_back(argument(a, element, what).toTensor());
      return out;
    }
    default: {
      bool optional_tensor = element->kind() == c10::TypeKind::OptionalType &&
                             element->expectRef<c10::OptionalType>().getElementType()->kind() ==
                                 c10::TypeKind::TensorType;
      if (optional_tensor) {
        c10::List<std::optional<at::Tensor>> out;
        for (const TapeArg& a : arg.list) out.push_back(argument(a, element, what).toOptional<at::Tensor>());
        return out;
      }
      c10::impl::GenericList out(element);
      for (const TapeArg& a : arg.list) out.push_back(argument(a, element, what));
      return out;
    }
  }
}

void TapeRunner::call_op(Step& step) {
  const TapeInstruction& ins = *step.instruction;
  const c10::FunctionSchema& schema = step.op->schema();
  const auto& declared = schema.arguments();
  std::string what = step.what + " (" + ins.name + ")";
  if (ins.args.size() > declared.size())
    format_error(tape_->where + ": " + what + ": " + std::to_string(ins.args.size()) + " arguments for its " +
                 std::to_string(declared.size()));
  for (const auto& kv : ins.kwargs) {
    bool known = false;
    for (size_t j = ins.args.size(); j < declared.size() && !known; ++j) known = declared[j].name() == kv.first;
    if (!known) format_error(tape_->where + ": " + what + ": no argument '" + kv.first + "' to give by name");
  }
  torch::jit::Stack stack;
  for (size_t j = 0; j < declared.size(); ++j) {
    const c10::Argument& a = declared[j];
    const TapeArg* given = j < ins.args.size() ? &ins.args[j] : nullptr;
    for (size_t m = 0; !given && m < ins.kwargs.size(); ++m)
      if (ins.kwargs[m].first == a.name()) given = &ins.kwargs[m].second;
    if (given)
      stack.push_back(argument(*given, a.type(), what + " argument '" + a.name() + "'"));
    else if (a.default_value())
      stack.push_back(*a.default_value());
    else
      format_error(tape_->where + ": " + what + ": argument '" + a.name() + "' is given no value and has no default");
  }
  step.op->callBoxed(stack);
  std::vector<at::Tensor> results;  // the returns flattened: a Tensor or Tensor? each, a Tensor[] tensor by tensor
  for (size_t j = 0; j < schema.returns().size() && j < stack.size(); ++j) {
    const c10::TypePtr& type = schema.returns()[j].type();
    const c10::IValue& value = stack[j];
    bool optional_tensor = type->kind() == c10::TypeKind::OptionalType &&
                           type->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::TensorType;
    if (type->kind() == c10::TypeKind::TensorType || optional_tensor)
      results.push_back(value.isTensor() ? value.toTensor() : at::Tensor());
    else if (type->kind() == c10::TypeKind::ListType && value.isTensorList())
      for (const at::Tensor& t : value.toTensorVector()) results.push_back(t);
  }
  if (results.size() != ins.out.size())
    format_error(tape_->where + ": " + what + ": " + std::to_string(results.size()) + " tensors returned for its " +
                 std::to_string(ins.out.size()) + " outputs");
  for (size_t j = 0; j < results.size(); ++j)
    if (ins.out[j] >= 0) values_[ins.out[j]] = std::move(results[j]);
}

void TapeRunner::launch(const Step& step) {
  const TapeInstruction& ins = *step.instruction;
  if (!modules_) format_error(tape_->where + ": " + step.what + ": a kernel launch in a tape for the CPU");
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device_).native_handle();
  modules_->launch(ins.index, ins.grid, ins.args, values_, stream, ins.pdl, step.what);
}

void TapeRunner::execute(std::vector<Step>& steps) {
  for (Step& step : steps) {
    const TapeInstruction& ins = *step.instruction;
    switch (ins.kind) {
      case TapeInstruction::Kind::Weight:
        values_[ins.out[0]] = network_.layers[ins.index].weights.at(ins.name);
        break;
      case TapeInstruction::Kind::Constant: {  // made once: no copy from the host per call, nor in a CUDA graph
        at::Tensor& made = constants_[ins.index];
        if (!made.defined()) {
          const TapeConstant& c = tape_->constants[ins.index];
          at::TensorOptions options = c.value.options().device(c.on_engine ? device_ : at::Device(at::kCPU));
          made = at::empty_strided(c.value.sizes(), c.strides, options).copy_(c.value);
        }
        values_[ins.out[0]] = made;
        break;
      }
      case TapeInstruction::Kind::Op:
        if (step.shared.empty()) {
          call_op(step);
        } else if (!reuse(step)) {
          call_op(step);
          keep_shared(step);
        }
        break;
      case TapeInstruction::Kind::Launch:
        launch(step);
        break;
    }
    for (int64_t v : step.frees) values_[v] = at::Tensor();
  }
}

void TapeRunner::start(at::TensorList inputs) {
  values_.assign(tape_->num_values, at::Tensor());
  constants_.assign(tape_->constants.size(), at::Tensor());
  for (size_t k = 0; k < inputs.size(); ++k)
    values_[k] = at::empty(tape_->inputs[k].second, inputs[k].options().device(device_)).copy_(inputs[k]);
  for (auto* steps : {&prologue_, &body_})
    for (Step& step : *steps)
      if (step.instruction->kind == TapeInstruction::Kind::Op && !step.op) {
        const TapeInstruction& ins = *step.instruction;
        try {
          step.op = c10::Dispatcher::singleton().findSchemaOrThrow(ins.name.c_str(), ins.overload.c_str());
        } catch (const c10::Error&) {
          format_error(tape_->where + ": " + step.what + ": this torch has no operator " + ins.name +
                       (ins.overload.empty() ? "" : "." + ins.overload));
        }
      }
  if (shared_) share_keys();
  if (device_.is_cuda() && !tape_->kernels.empty() && !modules_)
    modules_ = std::make_unique<TritonModules>(tape_->kernels, device_, tape_->where);
  execute(prologue_);
  if (shared_) share_made();
  if (reused_ && tape_log())
    std::cerr << "torchkiln: engine '" << shared_->engine << "' " << tape_->where.substr(7) << " on " << device_.str()
              << " took " << reused_ << " of its prologue's values from the engine's other tapes\n";
#ifdef TORCHKILN_CUDA
  if (device_.is_cuda() && capture_) {  // the body run once, then captured on a private pool
    auto graph = std::make_unique<Graph>();
    auto run_body = [this] { execute(body_); };
    if (std::optional<std::string> failed = capture_aside(graph->graph, {0, 0}, device_, run_body, run_body)) {
      TORCH_WARN(tape_->where, ": its body could not be captured as a CUDA graph, so it runs step by step from ",
                 "now on: ", *failed);
    } else {
      graph_ = std::move(graph);
    }
    if (graph_)
      graph_->graph.replay();
    else
      execute(body_);
    return;
  }
#endif
  execute(body_);
}

std::vector<at::Tensor> TapeRunner::run(at::TensorList inputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::DeviceGuard on_device(device_);
  replay(inputs);
  std::vector<at::Tensor> out;  // made in the caller's mode (inference tensors under inference_mode)
  for (int64_t v : tape_->outputs) out.push_back(values_[v].clone());
  return out;
}

void TapeRunner::replay(at::TensorList inputs) {
  // The buffers and values kept between calls are plain tensors, whether or not the first call was in inference mode.
  c10::InferenceMode not_inference(false);
  c10::AutoGradMode no_grad(false);
  if (!started_) {
    start(inputs);
    started_ = true;
    if (device_.is_cuda()) last_stream_ = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device_);
  } else {
    if (device_.is_cuda()) wait_for_last_call(last_stream_, device_);
    copy_inputs(values_, inputs);
    if (graph_) {
#ifdef TORCHKILN_CUDA
      graph_->graph.replay();
#endif
    } else {
      execute(body_);
    }
  }
}

}  // namespace torchkiln
