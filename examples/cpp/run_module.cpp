// run_module [--device DEV] [--runs N] MODEL.pt INPUTS.pt [OUTPUTS.pt]: load a module that torchkiln compiled and
// torch.jit.save'd, move the inputs (a tuple or list of arguments as torch.save writes it: tensors, and tuples,
// lists and dicts of them; a list of tensors is given as a Tensor[]) to DEV (cpu by default,
// or cuda, cuda:1), call it, print what it returns and save it (on the CPU). With --runs N it then calls the module
// N more times and prints the median per-call latency (synchronizing the GPU around each call; on a GPU also the
// median time between CUDA events recorded on the device's current stream before and after each call).
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>

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

c10::IValue moved(const c10::IValue& value, const at::Device& device) {
  if (value.isTensor()) return value.toTensor().to(device);
  if (value.isTuple() || value.isList()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec())
      items.push_back(moved(item, device));
    if (value.isTuple()) return c10::ivalue::Tuple::create(std::move(items));
    // A list from a file is untyped (List[Any]); one of tensors becomes the Tensor[] a module's signature takes.
    bool tensors = !items.empty() &&
                   std::all_of(items.begin(), items.end(), [](const c10::IValue& v) { return v.isTensor(); });
    if (tensors) {
      c10::List<at::Tensor> typed;
      for (auto& item : items) typed.push_back(item.toTensor());
      return typed;
    }
    c10::impl::GenericList list(value.toList().elementType());
    for (auto& item : items) list.push_back(std::move(item));
    return list;
  }
  if (value.isGenericDict()) {
    c10::impl::GenericDict dict(value.toGenericDict().keyType(), value.toGenericDict().valueType());
    for (const auto& entry : value.toGenericDict()) dict.insert(entry.key(), moved(entry.value(), device));
    return dict;
  }
  return value;
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

void synchronize(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: run_module [--device DEV] [--runs N] MODEL.pt INPUTS.pt [OUTPUTS.pt]\n";
  std::string device_name = "cpu";
  int runs = 0;
  std::vector<std::string> paths;
  for (int k = 1; k < argc; ++k) {
    std::string arg = argv[k];
    if (arg == "--device" && k + 1 < argc) {
      device_name = argv[++k];
    } else if (arg == "--runs" && k + 1 < argc) {
      std::string count = argv[++k];
      runs = count.empty() || count.size() > 7 || count.find_first_not_of("0123456789") != std::string::npos
                 ? -1
                 : std::stoi(count);
      if (runs < 0) {
        std::cerr << "--runs takes a count, got '" << count << "'\n" << usage;
        return 2;
      }
    } else if (arg.rfind("--", 0) == 0) {
      std::cerr << "unknown option '" << arg << "'\n" << usage;
      return 2;
    } else {
      paths.push_back(arg);
    }
  }
  if (paths.size() < 2 || paths.size() > 3) {
    std::cerr << usage;
    return 2;
  }
  try {
    at::Device device(device_name);
    if (device.is_cuda() && !torch::cuda::is_available()) {
      std::cerr << "--device " << device_name << ": this libtorch sees no CUDA device\n";
      return 2;
    }
    torch::jit::Module module = torch::jit::load(paths[0]);
    module.eval();
    c10::IValue inputs = moved(torch::jit::pickle_load(read_file(paths[1])), device);
    std::vector<c10::IValue> args = inputs.isTuple() ? inputs.toTupleRef().elements().vec() : inputs.toListRef().vec();
    torch::NoGradGuard no_grad;
    c10::IValue outputs = module.forward(args);
    synchronize(device);
    describe(outputs, "");
    if (paths.size() > 2) {
      std::vector<char> bytes = torch::jit::pickle_save(moved(outputs, at::kCPU));
      std::ofstream(paths[2], std::ios::binary).write(bytes.data(), bytes.size());
    }
    if (runs > 0) {
      std::vector<double> ms, event_ms;  // wall time between synchronizations; on a GPU, also CUDA events' time
      for (int k = 0; k < runs; ++k) {
        synchronize(device);
        std::optional<c10::Event> before, after;
        if (device.is_cuda()) {
          before.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);  // (timing enabled)
          after.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
          before->record(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device));
        }
        auto start = std::chrono::steady_clock::now();
        module.forward(args);
        if (after) after->record(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device));
        synchronize(device);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        if (after) event_ms.push_back(before->elapsedTime(*after));
      }
      std::cout << "latency_ms_median " << median(ms) << " runs " << runs << " device " << device;
      if (!event_ms.empty()) std::cout << " event_ms_median " << median(event_ms);
      std::cout << "\n";
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
