// Tapes (docs/tape_format.md): an engine's planned run recorded at build, read and checked at load (tape_loader.cpp)
// and replayed per device (tape.cpp) instead of the network's layers.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <ATen/core/dispatch/Dispatcher.h>
#ifdef TORCHKILN_CUDA
#include <ATen/cuda/CUDAGraph.h>
#endif

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchkiln {

struct Network;

// An operator or launch argument as the tape's JSON gives it; the operator's schema says what it becomes.
struct TapeArg {
  enum class Kind { None, Bool, Int, BigInt, Float, Str, Tensor, Dtype, Device, Layout, MemoryFormat, List };
  Kind kind = Kind::None;
  bool b = false;  // Bool; Device: true for the device the tape runs on, false for the CPU
  // Int (BigInt: an integer beyond int64, refused when run); Tensor: its value id; Dtype, Layout, MemoryFormat: the
  // enum's value
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<TapeArg> list;
};

struct TapeKernel {
  std::string name;
  std::string cubin;  // the bytes Triton compiled
  int64_t num_warps = 1, shared = 0;
  std::vector<std::string> params;  // "*fp16", "i32", ...
};

struct TapeConstant {
  at::Tensor value;  // on the CPU, contiguous
  std::vector<int64_t> strides;
  bool on_engine = true;  // made on the device the tape runs on, else on the CPU
};

struct TapeInstruction {
  enum class Kind { Weight, Constant, Op, Launch };
  Kind kind = Kind::Op;
  int64_t index = 0;           // Weight: the layer; Constant: the constant; Launch: the kernel
  std::string name, overload;  // Weight: the weight's name; Op: the operator's name and overload
  std::vector<TapeArg> args;   // Op: positional; Launch: one per kernel param
  std::vector<std::pair<std::string, TapeArg>> kwargs;
  std::vector<int64_t> out;  // the value ids written, -1 for an undefined tensor
  std::array<int64_t, 3> grid{};
  bool pdl = false;  // Launch: programmatically dependent on the kernel before it on the stream (a chained launch)
};

struct TapeTarget {
  std::string device_type, device_name, capability, torch, triton;
  std::string describe() const;  // "cuda NVIDIA H100 80GB HBM3 sm 9.0 torch 2.11.0"
};

struct Tape {
  std::string where;  // "engine tape K", for messages
  TapeTarget target;
  std::vector<std::pair<at::ScalarType, std::vector<int64_t>>> inputs;  // per binding: dtype, shape
  int64_t num_values = 0;
  std::vector<TapeKernel> kernels;
  std::vector<TapeConstant> constants;
  std::vector<TapeInstruction> prologue, body;
  std::vector<int64_t> outputs;
};

// A tape section's bytes checked and read (the spec's "What loading checks"); EngineFormatError naming `where` and
// the instruction otherwise. `network` is the engine's: its weights and its numbers of inputs and outputs.
Tape parse_tape(const uint8_t* data, size_t size, const std::string& where, const Network& network);

class TritonModules;

// Before a call that reuses a runner's buffers on a GPU: the previous call's work, queued on another stream, is done
// with them first (on one stream the order does it), as the Python runner waits; `last` becomes this stream.
void wait_for_last_call(std::optional<c10::Stream>& last, const at::Device& device);
// `inputs` copied into the first of `buffers`, in one launch where there are several (as the Python runner copies).
void copy_inputs(at::TensorList buffers, at::TensorList inputs);
// Whether TORCHKILN_TAPE_LOG=1 asks for the runtime's log lines on stderr (docs/deployment.md).
bool tape_log();

#ifdef TORCHKILN_CUDA
// As torch.cuda.graph does: on a side stream, after the work queued on the current one, `warm` runs (the
// workspaces cuBLAS and cuDNN keep per stream are made outside the capture, and an error shows there rather than
// mid-capture), then `body` is captured into `graph` on `pool` ({0, 0}: a private one); the current stream waits for
// both. The capture is thread-local: a server may run other engines on other threads meanwhile. Returns why the
// capture failed (a step it refuses; the graph is then dropped), else nullopt.
std::optional<std::string> capture_aside(at::cuda::CUDAGraph& graph, at::cuda::MempoolId_t pool,
                                         const at::Device& device, const std::function<void()>& warm,
                                         const std::function<void()>& body);
#endif

// The values the prologues of one engine's tapes on one device make from its weights alone (the weights placed on
// the device, in the plan's layouts, transposed): made by the first tape whose body reads one, then shared, so that an
// engine with tapes at many shapes holds its weights on the device once. The Python runner never writes what it
// placed (it shares them between every input shape it binds).
struct SharedValues {
  struct Made {
    std::vector<at::Tensor> outputs;
    std::optional<c10::Stream> stream;  // a GPU's: where they were made; another stream waits for it first
  };
  std::string engine;  // its name, for the log
  std::mutex mutex;
  std::map<std::string, Made> made;  // by the instruction that made them (operator, arguments, their inputs' keys)
};

// One tape run on one device: input buffers, the prologue's values, the body run as it is or replayed as a CUDA
// graph. Calls are serialized.
class TapeRunner {
 public:
  // `capture`: on a GPU, the body captured as a CUDA graph at the first call (the engine's cuda_graphs option)
  // `shared`: the values the engine's tapes on this device share (null: none shared)
  TapeRunner(std::shared_ptr<const Tape> tape, const Network& network, const at::Device& device, bool capture = true,
             std::shared_ptr<SharedValues> shared = nullptr);
  ~TapeRunner();
  std::vector<at::Tensor> run(at::TensorList inputs);

  struct Step {
    const TapeInstruction* instruction;
    std::string what;                      // "body instruction 3", for messages
    std::optional<c10::OperatorHandle> op;  // resolved at the first run
    std::vector<int64_t> frees;            // the values whose last reader this is
    std::string shared;                    // a prologue operator's key among the shared values, else empty
  };
  size_t reused() const { return reused_; }  // the prologue's operators whose outputs another tape had made

 private:
  struct Graph;
  void replay(at::TensorList inputs);  // the inputs copied in, the body run (the first call: start)
  void start(at::TensorList inputs);
  void execute(std::vector<Step>& steps);
  void call_op(Step& step);
  void share_keys();                // the prologue's `Step::shared` keys (the operators resolved)
  bool reuse(const Step& step);     // its outputs, where another tape made them; false otherwise
  void keep_shared(const Step& step);  // its outputs, made here: shared after the prologue where the body reads them
  void share_made();
  void launch(const Step& step);
  c10::IValue argument(const TapeArg& arg, const c10::TypePtr& type, const std::string& what) const;

  std::shared_ptr<const Tape> tape_;
  const Network& network_;  // the engine's, its weights on the CPU
  at::Device device_;
  bool capture_;
  std::shared_ptr<SharedValues> shared_;
  std::vector<bool> kept_;  // the values the body reads (or returns): the prologue's that stay
  size_t reused_ = 0;
  std::vector<std::pair<std::string, SharedValues::Made>> made_;  // the prologue's keyed outputs it made
  std::mutex mutex_;
  bool started_ = false;
  std::vector<at::Tensor> values_;
  std::vector<at::Tensor> constants_;  // each constant on its device, made at its first reader
  std::vector<Step> prologue_, body_;
  std::unique_ptr<TritonModules> modules_;
  std::unique_ptr<Graph> graph_;  // the body captured (CUDA builds, on a GPU)
  std::optional<c10::Stream> last_stream_;  // the stream the last call queued its work on (a GPU)
};

}  // namespace torchkiln
