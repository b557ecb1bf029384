// torchkiln_launch_check: a kernel taking every param type launched through TritonModules (what the tape runner
// launches with) on known arguments, then on an empty grid, then chained (a programmatic dependent launch). Run with
// fake_driver/libcuda.so.1 (tools/fake_libcuda.cpp) first on the library path, it prints what a GPU would be given
// (tests/test_cpp_tape.py checks it).
#include <cmath>
#include <cstdio>

#include "../src/triton_modules.h"

int main() {
  using torchkiln::TapeArg;
  auto arg = [](TapeArg::Kind kind, int64_t i, double f) {
    TapeArg a;
    a.kind = kind;
    a.i = i;
    a.f = f;
    return a;
  };
  std::vector<torchkiln::TapeKernel> kernels(1);
  torchkiln::TapeKernel& k = kernels[0];
  k.name = "every_type";
  k.num_warps = 4;
  k.shared = 65536;
  k.params = {"*fp32", "i1", "i8", "u16", "i32", "i64", "u64", "fp16", "bf16", "fp32", "fp64"};
  k.cubin = std::to_string(k.params.size() + 2);  // the fake driver's "cubin": the kernel's parameter count
  k.cubin.push_back('\0');
  double just_past_a_tie = 1 + std::ldexp(1, -11) + std::ldexp(1, -40);  // fp16 rounds it up, through a float down
  using K = TapeArg::Kind;
  std::vector<TapeArg> args = {
      arg(K::Tensor, 0, 0), arg(K::Int, 1, 0),  arg(K::Int, -3, 0),           arg(K::Int, 65535, 0),
      arg(K::Int, -7, 0),   arg(K::Int, int64_t(1) << 40, 0),                 arg(K::Int, -1, 0),
      arg(K::Float, 0, just_past_a_tie),        arg(K::Float, 0, 0.1),        arg(K::Float, 0, 0.1),
      arg(K::Float, 0, 0.1)};
  std::vector<at::Tensor> values = {at::zeros({3}).slice(0, 1)};  // its data pointer is past its storage's start
  torchkiln::TritonModules modules(kernels, at::Device(at::kCUDA, 0), "launch check");
  std::printf("data_ptr %p\n", values[0].data_ptr());
  std::fflush(stdout);
  void* stream = reinterpret_cast<void*>(0x1234);
  modules.launch(0, {2, 3, 4}, args, values, stream, false, "launch 0");
  modules.launch(0, {0, 1, 1}, args, values, stream, false, "launch 1");
  modules.launch(0, {5, 1, 1}, args, values, stream, true, "launch 2");
  return 0;
}
