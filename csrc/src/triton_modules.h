// A tape's generated kernels (cubins Triton compiled at build) loaded and launched with the CUDA driver API, which is
// opened at run time (dlopen of libcuda.so.1): no CUDA header or link for this part, and a process that runs no GPU
// tape never opens it. The launches are what Triton 3.6's launcher does.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "tape.h"

namespace torchkiln {

class TritonModules {
 public:
  // Each kernel's cubin loaded into `device`'s primary context; EngineFormatError where one does not load.
  TritonModules(const std::vector<TapeKernel>& kernels, const at::Device& device, const std::string& where);
  ~TritonModules();
  TritonModules(const TritonModules&) = delete;
  TritonModules& operator=(const TritonModules&) = delete;

  // Kernel `k` launched on `stream` (a cudaStream_t) with `args`: a tensor value's data pointer or a scalar per param;
  // `pdl`: programmatically dependent on the kernel before it on the stream (a chained launch).
  void launch(size_t k, const std::array<int64_t, 3>& grid, const std::vector<TapeArg>& args,
              const std::vector<at::Tensor>& values, void* stream, bool pdl, const std::string& what) const;

 private:
  const std::vector<TapeKernel>& kernels_;
  std::string where_;
  int device_;  // its index
  std::vector<void*> modules_, functions_;
};

}  // namespace torchkiln
