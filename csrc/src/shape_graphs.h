// A GPU engine's layers captured as a CUDA graph per input shape, for the calls no tape fits (an engine of dynamic
// shapes between the shapes its tapes were recorded at): the first call at a shape runs the layers on a side stream,
// captures them, and replays the capture; later calls at that shape copy their inputs into the capture's buffers,
// replay it and copy the outputs out, as the Python runner replays a graph per shape (docs/deployment.md).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "torchkiln/engine.h"

namespace torchkiln {

constexpr size_t kMaxShapeGraphs = 16;  // captures kept per engine and device (runner.py's MAX_GRAPHS)

class ShapeGraphs {
 public:
  // `network`: the engine's, its weights on `device` (kept alive by the engine); `name`: the engine's, for messages.
  ShapeGraphs(const Network& network, const at::Device& device, std::string name);
  ~ShapeGraphs();
  // The call's outputs, or nullopt where this build has no CUDA or a capture of these layers failed once (a layer
  // that waits on the GPU, a data-dependent size): the caller then runs the layers, now and from then on.
  std::optional<std::vector<at::Tensor>> run(const std::vector<at::Tensor>& inputs,
                                             const std::vector<int64_t>& symbols);

 private:
  struct Captured;
  using Key = std::vector<int64_t>;  // each input's dtype, rank, sizes and strides
  Captured* capture(const Key& key, const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& symbols);

  const Network& network_;
  at::Device device_;
  std::string name_;
  std::vector<size_t> gathers_;  // those whose indices are inputs: checked before each replay (input_gathers)
  std::mutex mutex_;  // calls are serialized: captures share one memory pool
  bool refused_ = false;
  std::list<std::pair<Key, std::unique_ptr<Captured>>> captured_;  // the most recently used first
  std::optional<c10::Stream> last_stream_;
  struct Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace torchkiln
