// run_module MODEL.pt INPUTS.pt [OUTPUTS.pt]: load a module that torchkiln compiled and torch.jit.save'd, call
// it on the inputs (a tuple or list of tensors, as torch.save writes it), print what it returns and save it.
#include <torch/script.h>

#include <fstream>
#include <iostream>
#include <iterator>

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void describe(const c10::IValue& value, const std::string& indent) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    std::cout << indent << "tensor " << t.scalar_type() << " " << t.sizes() << "\n";
  } else if (value.isTuple() || value.isList()) {
    auto items = value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
    std::cout << indent << (value.isTuple() ? "tuple" : "list") << " of " << items.size() << "\n";
    for (const auto& item : items) describe(item, indent + "  ");
  } else if (value.isGenericDict()) {
    std::cout << indent << "dict of " << value.toGenericDict().size() << "\n";
    for (const auto& entry : value.toGenericDict()) {
      std::cout << indent << "  " << entry.key() << ":\n";
      describe(entry.value(), indent + "    ");
    }
  } else {
    std::cout << indent << value.tagKind() << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: run_module MODEL.pt INPUTS.pt [OUTPUTS.pt]\n";
    return 2;
  }
  try {
    torch::jit::Module module = torch::jit::load(argv[1]);
    module.eval();
    c10::IValue inputs = torch::jit::pickle_load(read_file(argv[2]));
    std::vector<c10::IValue> args = inputs.isTuple() ? inputs.toTupleRef().elements().vec() : inputs.toListRef().vec();
    torch::NoGradGuard no_grad;
    c10::IValue outputs = module.forward(args);
    describe(outputs, "");
    if (argc > 3) {
      std::vector<char> bytes = torch::jit::pickle_save(outputs);
      std::ofstream(argv[3], std::ios::binary).write(bytes.data(), bytes.size());
    }
  } catch (const c10::Error& e) {  // e.g. the module's file is not TorchScript
    std::cerr << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {  // an error the module raised: its text names the type (EngineInputError: ...)
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
