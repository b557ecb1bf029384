// Running an engine: the input checks and symbol binding of runtime/engine.py and runtime/symbols.py, then each
// layer's meaning in order, intermediates freed after their last reader (runtime/executor.py); a control-flow
// layer's sub-networks run the same way, with the outer network's symbol values.
#include "torchkiln/engine.h"

#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <iostream>
#include <mutex>
#include <regex>

#include "kinds.h"
#include "shape_graphs.h"
#include "tape.h"

#ifdef TORCHKILN_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace torchkiln {

void format_error(const std::string& message) { C10_THROW_ERROR(Error, "EngineFormatError: " + message); }
void input_error(const std::string& message) { C10_THROW_ERROR(Error, "EngineInputError: " + message); }
void index_error(const std::string& message) { C10_THROW_ERROR(Error, "EngineIndexError: " + message); }

namespace {

using Wide = __int128;

int64_t narrow(Wide v) {
  if (v > INT64_MAX || v < INT64_MIN) throw std::invalid_argument("a symbolic dim's value overflows int64");
  return (int64_t)v;
}

Wide floordiv(Wide a, Wide b) {
  if (b == 0) throw std::invalid_argument("a symbolic dim divides by zero");
  Wide q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

Wide eval_wide(const Dim& d, const std::vector<int64_t>& symbols) {
  switch (d.op) {
    case Dim::Op::Int:
      return d.value;
    case Dim::Op::Sym:
      return symbols.at(d.value);
    default:
      break;
  }
  std::vector<Wide> args;
  for (const Dim& a : d.args) args.push_back(narrow(eval_wide(a, symbols)));
  Wide out = args[0];
  for (size_t k = 1; k < args.size(); ++k) {
    switch (d.op) {
      case Dim::Op::Add:
        out = narrow(out + args[k]);
        break;
      case Dim::Op::Mul:
        out = narrow(out * args[k]);
        break;
      case Dim::Op::Max:
        out = std::max(out, args[k]);
        break;
      case Dim::Op::Min:
        out = std::min(out, args[k]);
        break;
      case Dim::Op::FloorDiv:
        out = floordiv(out, args[k]);
        break;
      case Dim::Op::Mod:
        out = out - floordiv(out, args[k]) * args[k];
        break;
      default:
        break;
    }
  }
  return out;
}

std::string py_tuple(at::IntArrayRef v) {
  if (v.size() == 1) return "(" + std::to_string(v[0]) + ",)";
  return "(" + c10::Join(", ", v) + ")";
}

std::string torch_dtype(at::ScalarType t) { return "torch." + kinds().dtype_name(t); }

// A layout as Python prints it (torch.sparse_coo, ...), for the input error the Python runtime raises too.
std::string torch_layout(c10::Layout layout) {
  switch (layout) {
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    case c10::kMkldnn: return "torch._mkldnn";
    case c10::kJagged: return "torch.jagged";
    default: return "torch.strided";
  }
}

}  // namespace

int64_t Dim::eval(const std::vector<int64_t>& symbols) const { return narrow(eval_wide(*this, symbols)); }

const Param& Layer::param(const std::string& key) const { return params.at(key); }
bool Layer::has(const std::string& key) const { return params.at(key).kind != Param::Kind::None; }
double Layer::real(const std::string& key) const { return params.at(key).f; }
const std::string& Layer::str(const std::string& key) const { return params.at(key).s; }
bool Layer::flag(const std::string& key) const { return params.at(key).b; }
int64_t Layer::integer(const std::string& key, const Env& env) const { return params.at(key).i.eval(env.symbols); }
std::vector<int64_t> Layer::ints(const std::string& key, const Env& env) const {
  std::vector<int64_t> out;
  for (const Param& p : params.at(key).list) out.push_back(p.i.eval(env.symbols));
  return out;
}
const at::Tensor* Layer::weight(const std::string& key) const {
  auto it = weights.find(key);
  return it == weights.end() ? nullptr : &it->second;
}

void Engine::check_inputs(const std::vector<at::Tensor>& inputs) const {
  if (inputs.size() != bindings.size()) {
    std::vector<std::string> names;
    for (const Binding& b : bindings) names.push_back("'" + b.name + "'");
    input_error("engine '" + name + "' expects " + std::to_string(bindings.size()) + " inputs (" +
                c10::Join(", ", names) + "), got " + std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Binding& b = bindings[i];
    const at::Tensor& value = inputs[i];
    std::string what = "engine input " + std::to_string(i) + " ('" + b.name + "')";
    if (value.device().type() != (device_type == "cuda" ? at::kCUDA : at::kCPU))
      input_error(what + ": expected a tensor on " + device_type + ", got one on " + value.device().str());
    if (value.layout() != at::kStrided)
      input_error(what + ": expected a dense tensor, got layout " + torch_layout(value.layout()) +
                  " (to_dense() makes one)");
    if (value.is_nested())
      input_error(what + ": expected a dense tensor, got a nested tensor (to_padded_tensor() makes one)");
    if (value.scalar_type() != b.dtype)
      input_error(what + ": expected dtype " + torch_dtype(b.dtype) + ", got " + torch_dtype(value.scalar_type()));
    at::IntArrayRef shape = value.sizes();
    if (shape.vec() == b.opt_shape) continue;
    bool ranked = shape.size() == b.opt_shape.size();
    if (ranked && b.min_shape != b.max_shape)
      for (size_t d = 0; d < shape.size(); ++d)
        if (!(b.min_shape[d] <= shape[d] && shape[d] <= b.max_shape[d]))
          input_error(what + ": dim " + std::to_string(d) + " is " + std::to_string(shape[d]) +
                      ", outside the range [" + std::to_string(b.min_shape[d]) + ", " + std::to_string(b.max_shape[d]) +
                      "] the engine was built for (shape " + py_tuple(shape) + "; min " + py_tuple(b.min_shape) +
                      ", max " + py_tuple(b.max_shape) + ")");
    bool fits = ranked;
    for (size_t d = 0; fits && d < shape.size(); ++d) fits = b.min_shape[d] <= shape[d] && shape[d] <= b.max_shape[d];
    if (!fits) {
      std::string expected = b.min_shape == b.max_shape
                                 ? py_tuple(b.opt_shape)
                                 : "within min " + py_tuple(b.min_shape) + " and max " + py_tuple(b.max_shape);
      input_error(what + ": expected shape " + expected + ", got " + py_tuple(shape));
    }
  }
}

std::vector<int64_t> Engine::bind(const std::vector<at::Tensor>& inputs) const {
  const std::vector<TensorInfo>& tensors = network.tensors;
  std::vector<int64_t> values(symbols.size(), -1);
  std::vector<std::pair<int, int>> first(symbols.size());
  for (int i = 0; i < network.num_inputs; ++i)
    for (size_t j = 0; j < tensors[i].shape.size(); ++j) {
      const Dim& d = tensors[i].shape[j];
      if (d.op != Dim::Op::Sym) continue;
      const Symbol& s = symbols[d.value];
      int64_t value = inputs[i].size(j);
      std::string what = "engine input " + std::to_string(i) + " ('" + tensors[i].name + "') dim " + std::to_string(j);
      if (!(s.lo <= value && value <= s.hi))
        input_error(what + " is " + std::to_string(value) + ", outside the range [" + std::to_string(s.lo) + ", " +
                    std::to_string(s.hi) + "] of " + s.name + " the engine was built for");
      if (values[d.value] >= 0 && values[d.value] != value) {
        auto [k, m] = first[d.value];
        input_error(what + " is " + std::to_string(value) + " but input " + std::to_string(k) + " ('" +
                    tensors[k].name + "') dim " + std::to_string(m) + " is " + std::to_string(values[d.value]) +
                    "; both are " + s.name + " and must be equal");
      }
      if (values[d.value] < 0) first[d.value] = {i, (int)j};
      values[d.value] = value;
    }
  for (size_t k = 0; k < values.size(); ++k)
    if (values[k] < 0) values[k] = symbols[k].lo;  // a symbol no input dim names (none is written so)
  return values;
}

std::vector<at::Tensor> run_network(const Network& network, const std::vector<at::Tensor>& inputs, const Env& env) {
  std::vector<int64_t> values = env.symbols;  // a data-dependent layer binds its size here, for this run
  Env own{values, env.device, env.meta, env.capturing};
  std::vector<at::Tensor> slots(network.tensors.size());
  for (int i = 0; i < network.num_inputs; ++i) slots[i] = inputs[i];
  std::vector<at::Tensor> xs;
  for (const Layer& layer : network.layers) {
    xs.clear();
    for (int s : layer.inputs) xs.push_back(slots[s]);
    std::vector<at::Tensor> outs = layer.meaning(layer, xs, own);
    if ((layer.kind == "non_zero" || layer.kind == "unique") && !outs.empty())  // its size, known now (env reads it)
      values[layer.param("count").i.value] = outs[0].size(0);
    for (size_t k = 0; k < layer.outputs.size(); ++k) {
      const TensorInfo& t = network.tensors[layer.outputs[k]];
      bool same = k < outs.size() && outs[k].scalar_type() == t.dtype && outs[k].dim() == (int64_t)t.shape.size();
      for (size_t d = 0; same && d < t.shape.size(); ++d) same = outs[k].size(d) == t.shape[d].eval(values);
      if (!same)
        format_error(network.what + " layer '" + layer.name + "' (" + layer.kind +
                     ") computed an output other "
                     "than the " +
                     kinds().dtype_name(t.dtype) + " tensor of " + std::to_string(t.shape.size()) +
                     " dims its engine declares for '" + t.name + "'");
      slots[layer.outputs[k]] = std::move(outs[k]);
    }
    for (int s : layer.frees) slots[s] = at::Tensor();
  }
  std::vector<at::Tensor> result;
  for (size_t k = 0; k < network.outputs.size(); ++k)
    result.push_back(network.clone_output[k] ? slots[network.outputs[k]].clone() : slots[network.outputs[k]]);
  return result;
}

std::vector<at::Tensor> Engine::execute(const std::vector<at::Tensor>& inputs) const {
  check_inputs(inputs);
  at::Device device = inputs.empty() ? at::Device(device_type) : inputs[0].device();
  for (const at::Tensor& x : inputs)
    if (x.device() != device) {
      std::set<std::string> seen;
      for (const at::Tensor& y : inputs) seen.insert("'" + y.device().str() + "'");
      input_error("engine '" + name + "': all inputs must be on one device, got [" + c10::Join(", ", seen) + "]");
    }
  c10::AutoGradMode no_grad(false);
  if (TapeRunner* runner = tape_runner(inputs, device)) return runner->run(inputs);
  std::vector<int64_t> values = symbols.empty() ? std::vector<int64_t>{} : bind(inputs);
  const Network& on_device = network_on(device);
  if (ShapeGraphs* graphs = shape_graphs(device, on_device))
    if (auto outputs = graphs->run(inputs, values)) return *std::move(outputs);
  return run_network(on_device, inputs, Env{values, device, false});
}

bool Engine::captures_layers(const at::Device& device) const {
  return device.is_cuda() && backend == "cuda" && cuda_graphs;
}

ShapeGraphs* Engine::shape_graphs(const at::Device& device, const Network& on_device) const {
  if (!captures_layers(device)) return nullptr;
  std::lock_guard<std::mutex> lock(tape_mutex_);
  auto& graphs = shape_graphs_[{static_cast<int>(device.type()), device.index()}];
  if (!graphs) graphs = std::make_shared<ShapeGraphs>(on_device, device, name);
  return graphs.get();
}

namespace {

// What a tape's target must equal for it to run here; empty where this runtime cannot tell (a GPU in a build
// without CUDA).
std::optional<TapeTarget> target_here(const at::Device& device) {
  std::string torch = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                      std::to_string(TORCH_VERSION_PATCH);
  if (device.is_cpu()) return TapeTarget{"cpu", "", "", torch, ""};
#ifdef TORCHKILN_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
    return TapeTarget{"cuda", p->name, std::to_string(p->major) + "." + std::to_string(p->minor), torch, ""};
  }
#endif
  return std::nullopt;
}

}  // namespace

namespace {

bool same_target(const TapeTarget& a, const TapeTarget& b) {
  return a.device_type == b.device_type && a.device_name == b.device_name && a.capability == b.capability &&
         a.torch == b.torch;
}

bool fits_inputs(const Tape& tape, at::TensorList inputs) {
  if (tape.inputs.size() != inputs.size()) return false;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].scalar_type() != tape.inputs[k].first || !inputs[k].sizes().equals(tape.inputs[k].second))
      return false;
  return true;
}

}  // namespace

const std::vector<size_t>& Engine::tapes_for(const at::Device& device) const {
  const std::pair<int, int> where{static_cast<int>(device.type()), device.index()};
  auto fitting = tapes_here_.find(where);
  if (fitting == tapes_here_.end()) {
    std::optional<TapeTarget> here = target_here(device);
    std::vector<size_t> ks;
    for (size_t k = 0; k < tapes.size(); ++k)
      if (here && same_target(tapes[k]->target, *here)) ks.push_back(k);
    fitting = tapes_here_.emplace(where, std::move(ks)).first;
  }
  return fitting->second;
}

bool Engine::has_tape_for(const at::Device& device) const {
  std::lock_guard<std::mutex> lock(tape_mutex_);
  return !tapes_for(device).empty();
}

TapeRunner* Engine::fitting_tape_runner(at::TensorList inputs, const at::Device& device) const {
  // Per call: the tapes whose target is this device (worked out at its first call) against the inputs' shapes.
  const std::pair<int, int> where{static_cast<int>(device.type()), device.index()};
  std::lock_guard<std::mutex> lock(tape_mutex_);
  for (size_t k : tapes_for(device)) {
    if (!fits_inputs(*tapes[k], inputs)) continue;
    auto& runner = tape_runners_[{where, k}];
    if (!runner) {
      auto& shared = shared_values_[where];
      if (!shared) shared = std::make_shared<SharedValues>(), shared->engine = name;
      runner = std::make_shared<TapeRunner>(tapes[k], network, device, cuda_graphs, shared);
      if (tape_log())
        std::cerr << "torchkiln: engine '" << name << "' runs tape " << k << " on " << device.str() << "\n";
    }
    return runner.get();
  }
  return nullptr;
}

std::optional<std::vector<at::Tensor>> Engine::run_fitting_tape(at::TensorList inputs) const {
  // (a device of another kind than the engine's has no tape: `tapes_for` compares the kinds)
  if (tapes.empty() || inputs.empty() || inputs.size() != bindings.size()) return std::nullopt;
  const at::Device device = inputs[0].device();
  for (const at::Tensor& x : inputs)
    if (!x.defined() || x.layout() != at::kStrided || x.is_nested() || x.device() != device) return std::nullopt;
  TapeRunner* runner = fitting_tape_runner(inputs, device);
  if (!runner) return std::nullopt;
  c10::AutoGradMode no_grad(false);
  return runner->run(inputs);
}

TapeRunner* Engine::tape_runner(const std::vector<at::Tensor>& inputs, const at::Device& device) const {
  if (tapes.empty() && backend != "cuda") return nullptr;  // a cuda engine's build records a tape unless it cannot
  if (TapeRunner* runner = fitting_tape_runner(inputs, device)) return runner;
  // No tape fits: say why (an error where the tapes are all for other GPUs, else a warning once). Once warned, a call
  // that cannot be that error (no tapes, or tapes for this device at other shapes) returns at once: nothing to say.
  if (warned_.load() && (tapes.empty() || has_tape_for(device))) return nullptr;
  std::optional<TapeTarget> here = target_here(device);
  std::vector<std::string> targets, shapes;
  for (const auto& tape : tapes)
    if (here && same_target(tape->target, *here))
      shapes.push_back(tensors_text(tape->inputs));
    else
      targets.push_back(tape->target.describe());
  if (here && device.is_cuda() && backend == "cuda" && !targets.empty() && shapes.empty())
    // Its plan is for other GPUs (or another torch): the C++ runtime does not plan again, as the Python one would.
    format_error("engine '" + name + "' has no plan for " + here->describe() + ": its tapes are for " +
                 c10::Join(", ", targets) + "; build it on this GPU (the Python runtime plans it again here)");
  if (!warned_.exchange(true)) {
    std::string why;
    if (tapes.empty())
      why = "it holds no tape (its build's log says why)";
    else if (!here)
      why = "this runtime was built without CUDA, so it cannot tell which GPU it runs on";
    else if (!shapes.empty())
      why = "its tapes for " + here->describe() + " run inputs " + c10::Join("; ", shapes) + ", not this call's " +
            tensors_text(inputs);
    else
      why = "its tapes are for " + c10::Join(", ", targets) + ", not " + here->describe();
    TORCH_WARN("torchkiln: engine '", name, "' runs its layers one ATen call at a time",
               captures_layers(device) ? " (captured as a CUDA graph per input shape)" : "", ", not a tape: ", why);
  }
  return nullptr;
}

namespace {

// `network` with every weight, its sub-networks' included, copied to `device`.
std::shared_ptr<const Network> copied_to(const Network& network, const at::Device& device) {
  auto moved = std::make_shared<Network>(network);
  for (Layer& layer : moved->layers) {
    for (auto& [key, w] : layer.weights) w = w.to(device);
    for (auto& sub : layer.subnetworks) sub = copied_to(*sub, device);
  }
  return moved;
}

}  // namespace

const Network& Engine::network_on(const at::Device& device) const {
  if (device.type() == at::kCPU) return network;
  static std::mutex mutex;  // engines may run on several threads; copies are made once
  std::lock_guard<std::mutex> lock(mutex);
  auto& held = device_networks_[device.str()];
  if (!held) held = copied_to(network, device);
  return *held;
}

std::string Engine::signature() const {
  std::vector<std::string> ins, outs;
  const std::vector<TensorInfo>& tensors = network.tensors;
  for (int i = 0; i < network.num_inputs; ++i) {
    const Binding& b = bindings[i];
    std::vector<std::string> dims;
    for (size_t d = 0; d < tensors[i].shape.size(); ++d) {
      std::string text = b.min_shape[d] == b.max_shape[d]
                             ? std::to_string(b.min_shape[d])
                             : std::to_string(b.min_shape[d]) + ".." + std::to_string(b.max_shape[d]);
      const Dim& dim = tensors[i].shape[d];
      dims.push_back(dim.op == Dim::Op::Sym ? symbols[dim.value].name + "=" + text : text);
    }
    ins.push_back(kinds().dtype_name(b.dtype) + "[" + c10::Join(",", dims) + "]");
  }
  for (int s : network.outputs) {
    std::vector<std::string> dims;
    for (const Dim& d : tensors[s].shape) dims.push_back(d.is_int() ? std::to_string(d.value) : "?");
    outs.push_back(kinds().dtype_name(tensors[s].dtype) + "[" + c10::Join(",", dims) + "]");
  }
  return "inputs: " + c10::Join(", ", ins) + "; outputs: " + c10::Join(", ", outs);
}

bool Engine::fits(const std::string& expected) const {
  // The inputs' part exactly (or as modules compiled before symbols were named wrote it); the outputs' dtypes,
  // ranks and static dims (a symbolic output dim is sympy's text in Python, checked here as not an integer).
  std::string mine = signature();
  size_t cut = mine.find("; outputs: "), theirs = expected.find("; outputs: ");
  if (theirs == std::string::npos) return false;
  std::string ins = expected.substr(0, theirs), my_ins = mine.substr(0, cut);
  static const std::regex symbol_name(R"(([\[,])[A-Za-z_]\w*=)");
  if (ins != my_ins && ins != std::regex_replace(my_ins, symbol_name, "$1")) return false;
  static const std::regex spec(R"((\w+)\[([^\[\]]*)\])");
  std::string tail = expected.substr(theirs + 11), my_tail = mine.substr(cut + 11);
  auto specs = [](const std::string& text) {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    for (std::sregex_iterator it(text.begin(), text.end(), spec), end; it != end; ++it) {
      std::vector<std::string> dims;
      std::string body = (*it)[2], part;
      int depth = 0;
      for (char c : body) {
        depth += (c == '(') - (c == ')');
        if (c == ',' && depth == 0)
          dims.push_back(part), part.clear();
        else
          part += c;
      }
      if (!body.empty()) dims.push_back(part);
      out.emplace_back((*it)[1], dims);
    }
    return out;
  };
  auto a = specs(tail), b = specs(my_tail);
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].first != b[k].first || a[k].second.size() != b[k].second.size()) return false;
    for (size_t d = 0; d < a[k].second.size(); ++d) {
      std::string x = a[k].second[d];
      x.erase(0, x.find_first_not_of(' '));
      bool number = !x.empty() && x.find_first_not_of("0123456789") == std::string::npos;
      if (b[k].second[d] == "?" ? number : x != b[k].second[d]) return false;
    }
  }
  return true;
}

}  // namespace torchkiln
