// torchkiln's C++ runtime: engine bytes read, checked and run with no Python (docs/deployment.md).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torchkiln {

// The errors of torchkiln.errors, as c10::Error whose text starts with the type name (torchkiln.load maps them
// back to the Python types).
[[noreturn]] void format_error(const std::string& message);
[[noreturn]] void input_error(const std::string& message);
[[noreturn]] void index_error(const std::string& message);

// A dim: an int, or an integer expression over the network's symbols (the engine's JSON tree, ir/symbolic.py).
struct Dim {
  enum class Op { Int, Sym, Add, Mul, Max, Min, FloorDiv, Mod };
  Op op = Op::Int;
  int64_t value = 0;  // Int: the value; Sym: the symbol's index
  std::vector<Dim> args;
  bool is_int() const { return op == Op::Int; }
  int64_t eval(const std::vector<int64_t>& symbols) const;  // EngineFormatError where it overflows
};
using Shape = std::vector<Dim>;

struct Symbol {
  std::string name;
  int64_t lo, hi;
};

// A layer parameter: a JSON value checked against its kind's declared type (csrc/layer_kinds.json).
struct Param {
  enum class Kind { None, Bool, Int, Float, Str, List };
  Kind kind = Kind::None;
  bool b = false;
  Dim i;  // Int: an int or a symbolic dim
  double f = 0;
  std::string s;  // Str, and enums by their value
  std::vector<Param> list;
};

struct TensorInfo {
  std::string name;
  at::ScalarType dtype;
  Shape shape;
  at::Tensor constant;  // the value, where a constant layer makes it
};

struct Layer;
struct Network;
struct Env {
  const std::vector<int64_t>& symbols;  // each symbol's value for this call
  at::Device device;
  bool meta;  // shape inference on meta tensors: no values to check
  // the layers captured as a CUDA graph: nothing reads a value on the host or copies from it (the gather indices
  // read from the inputs are checked before each replay, check_input_indices; computed ones by the device)
  bool capturing = false;
};
using Meaning = std::vector<at::Tensor> (*)(const Layer&, const std::vector<at::Tensor>&, const Env&);

struct Layer {
  std::string kind, name;
  std::vector<int> inputs, outputs;  // tensor slots
  std::map<std::string, at::Tensor> weights;
  std::map<std::string, Param> params;
  Meaning meaning = nullptr;
  std::vector<int> frees;                                   // slots whose last reader this is
  std::vector<std::shared_ptr<const Network>> subnetworks;  // control flow: its kind's, in declared order

  const Param& param(const std::string& key) const;
  int64_t integer(const std::string& key, const Env& env) const;
  std::vector<int64_t> ints(const std::string& key, const Env& env) const;  // a tuple[int]; [] where None
  double real(const std::string& key) const;
  const std::string& str(const std::string& key) const;  // str or enum value
  bool flag(const std::string& key) const;
  bool has(const std::string& key) const;  // the parameter is not None
  const at::Tensor* weight(const std::string& key) const;
};

// A network, or a control-flow layer's sub-network (bound by its outer network's symbols).
struct Network {
  std::string name;                 // as the engine's JSON names it
  std::string what;                 // "engine 'NAME'" or "sub-network 'NAME'", for messages
  std::vector<TensorInfo> tensors;  // by slot: network inputs, then each layer's outputs
  int num_inputs = 0;
  std::vector<Layer> layers;
  std::vector<int> outputs;
  std::vector<bool> clone_output;  // an output that may alias an input or a weight is copied
};

// A network's outputs: each layer's meaning in order, intermediates freed after their last reader, a data-dependent
// size bound as its layer runs (`env` holds the outer network's symbol values).
std::vector<at::Tensor> run_network(const Network& network, const std::vector<at::Tensor>& inputs, const Env& env);

struct Binding {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> min_shape, opt_shape, max_shape;
};

struct Tape;  // a recorded run of the engine's plan (docs/tape_format.md, csrc/src/tape.h)
class TapeRunner;
class ShapeGraphs;
struct SharedValues;

struct Limits {
  std::optional<double> max_memory, max_flops;  // None: TORCHKILN_MAX_ENGINE_* or the device's default
};

// Whether engine bytes name a "tape.K" section, read from their section table alone (nothing else is checked).
bool holds_tapes(const uint8_t* data, size_t size);

class Engine {
 public:
  static std::shared_ptr<Engine> deserialize(const uint8_t* data, size_t size, const Limits& limits = {});
  std::vector<at::Tensor> execute(const std::vector<at::Tensor>& inputs) const;
  // A call's outputs where a tape for its device fits it exactly (plain tensors on one device, the tape's dtypes and
  // shapes); nullopt, with no check, warning or error, otherwise. A Python process that hosts this library runs
  // these calls here and hands the others to the package's runtime (op.cpp).
  std::optional<std::vector<at::Tensor>> run_fitting_tape(at::TensorList inputs) const;
  bool has_tape_for(const at::Device& device) const;  // a tape whose target is `device`
  std::string signature() const;                 // what a module records of its engine (runtime/execute_op.py)
  bool fits(const std::string& expected) const;  // `expected` is this engine's signature (or its legacy form)

  std::string name, device_type, backend;
  at::ScalarType precision;
  std::vector<Binding> bindings;
  std::vector<Symbol> symbols;
  Network network;
  std::vector<std::string> plan_targets;  // Target.describe() of each stored plan
  std::vector<std::shared_ptr<const Tape>> tapes;  // its "tape.K" sections, by K
  bool cuda_graphs = true;  // its backend option: a GPU tape's body is replayed as a CUDA graph

 private:
  void check_inputs(const std::vector<at::Tensor>& inputs) const;
  std::vector<int64_t> bind(const std::vector<at::Tensor>& inputs) const;
  // The network with its weights (its sub-networks' too) on `device`: `network` on the CPU, else a copy made once
  // per device and kept.
  const Network& network_on(const at::Device& device) const;
  mutable std::map<std::string, std::shared_ptr<const Network>> device_networks_;
  // The runner of a tape that fits this call (its device, GPU, torch, input shapes and dtypes), else null, with a
  // warning the first time saying why the layers run instead.
  TapeRunner* tape_runner(const std::vector<at::Tensor>& inputs, const at::Device& device) const;
  TapeRunner* fitting_tape_runner(at::TensorList inputs, const at::Device& device) const;  // or null
  const std::vector<size_t>& tapes_for(const at::Device& device) const;  // those whose target it is (tape_mutex_ held)
  mutable std::mutex tape_mutex_;
  // by device (its type and index): the tapes whose target is that device; the runners made, by (device, tape)
  mutable std::map<std::pair<int, int>, std::vector<size_t>> tapes_here_;
  mutable std::map<std::pair<std::pair<int, int>, size_t>, std::shared_ptr<TapeRunner>> tape_runners_;
  mutable std::map<std::pair<int, int>, std::shared_ptr<SharedValues>> shared_values_;  // what its tapes share
  mutable std::atomic<bool> warned_{false};
  // A `cuda` engine's layers on a GPU, where no tape fits: captured as a CUDA graph per input shape (by device)
  bool captures_layers(const at::Device& device) const;  // (its cuda_graphs option on)
  ShapeGraphs* shape_graphs(const at::Device& device, const Network& on_device) const;
  mutable std::map<std::pair<int, int>, std::shared_ptr<ShapeGraphs>> shape_graphs_;  // (tape_mutex_ held)
};

// The gather layers that read a network input as their indices (their places in `network.layers`).
std::vector<size_t> input_gathers(const Network& network);
// Those gathers' indices checked against their data's sizes (EngineIndexError), as each layer checks them when it
// runs.
void check_input_indices(const Network& network, const std::vector<size_t>& gathers,
                         const std::vector<at::Tensor>& inputs, const Env& env);

// Shape inference and execution: each layer kind's ATen meaning (ir/reference.py).
Meaning meaning_of(const std::string& kind);
// A layer's checks before shape inference (ir/layers.py's validate), EngineFormatError naming it.
void validate_layer(const Layer& layer, const std::vector<TensorInfo>& tensors, const std::vector<Symbol>& symbols,
                    const std::string& where);

}  // namespace torchkiln
