// CUDA graphs of an engine's layers, one per input shape (shape_graphs.h).
#include "shape_graphs.h"

#include <iostream>

#ifdef TORCHKILN_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "kinds.h"
#include "tape.h"

namespace torchkiln {

struct ShapeGraphs::Captured {
  std::vector<at::Tensor> inputs, outputs;  // the capture's buffers
#ifdef TORCHKILN_CUDA
  at::cuda::CUDAGraph graph;
#endif
};

struct ShapeGraphs::Pool {
#ifdef TORCHKILN_CUDA
  at::cuda::MempoolId_t id = at::cuda::graph_pool_handle();  // the captures' memory, shared: calls are serialized
#endif
};

ShapeGraphs::ShapeGraphs(const Network& network, const at::Device& device, std::string name)
    : network_(network),
      device_(device),
      name_(std::move(name)),
      gathers_(input_gathers(network)),
      pool_(std::make_unique<Pool>()) {}

ShapeGraphs::~ShapeGraphs() = default;

namespace {

// A buffer for `x`: its strides where they leave no gaps or overlaps (the layers then see the strides the call
// gives, as they do uncaptured), else row-major.
at::Tensor buffer_like(const at::Tensor& x) {
  return x.is_non_overlapping_and_dense() ? at::empty_strided(x.sizes(), x.strides(), x.options())
                                          : at::empty(x.sizes(), x.options());
}

}  // namespace

std::optional<std::vector<at::Tensor>> ShapeGraphs::run(const std::vector<at::Tensor>& inputs,
                                                        const std::vector<int64_t>& symbols) {
#ifdef TORCHKILN_CUDA
  std::lock_guard<std::mutex> lock(mutex_);
  if (refused_) return std::nullopt;
  c10::DeviceGuard on_device(device_);
  Key key;
  for (const at::Tensor& x : inputs) {
    key.push_back(static_cast<int64_t>(x.scalar_type()));
    key.push_back(x.dim());
    key.insert(key.end(), x.sizes().begin(), x.sizes().end());
    key.insert(key.end(), x.strides().begin(), x.strides().end());
  }
  Captured* found = nullptr;
  {
    // The capture's buffers and values are plain tensors that record no autograd history, whatever the caller's mode.
    c10::InferenceMode not_inference(false);
    c10::AutoGradMode no_grad(false);
    wait_for_last_call(last_stream_, device_);
    for (auto it = captured_.begin(); it != captured_.end(); ++it)
      if (it->first == key) {
        captured_.splice(captured_.begin(), captured_, it);
        found = captured_.front().second.get();
        break;
      }
    if (found) {
      // the capture checks no index on the host; the first call at this shape (uncaptured, before it) checked all
      check_input_indices(network_, gathers_, inputs, Env{symbols, device_, false});
      copy_inputs(found->inputs, inputs);
    } else {
      found = capture(key, inputs, symbols);
      if (!found) return std::nullopt;
    }
    found->graph.replay();
  }
  std::vector<at::Tensor> out;  // copied out (in the caller's mode): the next replay writes the buffers again
  for (const at::Tensor& o : found->outputs) out.push_back(o.clone());
  return out;
#else
  (void)inputs;
  (void)symbols;
  return std::nullopt;
#endif
}

ShapeGraphs::Captured* ShapeGraphs::capture(const Key& key, const std::vector<at::Tensor>& inputs,
                                           const std::vector<int64_t>& symbols) {
#ifdef TORCHKILN_CUDA
  // the layers run once with every check, on the host (and cuBLAS's and cuDNN's workspaces made), then are captured
  // into the shared pool; the caller's stream then replays the capture
  auto made = std::make_unique<Captured>();
  for (const at::Tensor& x : inputs) made->inputs.push_back(buffer_like(x));
  std::optional<std::string> failed = capture_aside(
      made->graph, pool_->id, device_,
      [&] {
        copy_inputs(made->inputs, inputs);
        run_network(network_, made->inputs, Env{symbols, device_, false});
      },
      [&] { made->outputs = run_network(network_, made->inputs, Env{symbols, device_, false, true}); });
  if (failed) {
    TORCH_WARN("torchkiln: engine '", name_, "': its layers could not be captured as a CUDA graph, so they run ",
               "one ATen call at a time from now on: ", *failed);
    refused_ = true;
    captured_.clear();
    return nullptr;
  }
  if (tape_log())
    std::cerr << "torchkiln: engine '" << name_ << "' captures its layers for inputs " << tensors_text(inputs)
              << " on " << device_.str() << "\n";
  captured_.emplace_front(key, std::move(made));
  if (captured_.size() > kMaxShapeGraphs) {
    // the least recently used goes; its input buffers return to the allocator, so its last replay must be done
    // (the caller's stream waited for the last call's: wait_for_last_call)
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
    captured_.pop_back();
  }
  return captured_.front().second.get();
#else
  (void)key;
  (void)inputs;
  (void)symbols;
  return nullptr;
#endif
}

}  // namespace torchkiln
