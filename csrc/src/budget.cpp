#include "budget.h"

#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>

namespace torchkiln {
namespace {

constexpr double kCpuMemoryShare = 0.5, kCpuCoreFlops = 5e10, kComputeSeconds = 60;

double cpu_memory() {
  double total = (double)sysconf(_SC_PAGE_SIZE) * (double)sysconf(_SC_PHYS_PAGES);
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    std::string text;
    if (f >> text && !text.empty() && text.find_first_not_of("0123456789") == std::string::npos)
      total = std::min(total, std::stod(text));
  }
  return total;
}

int cpu_cores() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

double ceiling(std::optional<double> value, const char* env, const char* what, double fallback) {
  if (!value) {
    const char* raw = std::getenv(env);
    if (!raw) return fallback;
    char* end = nullptr;
    double number = std::strtod(raw, &end);
    if (end == raw || *end != '\0' || !std::isfinite(number) || number < 0)
      C10_THROW_ERROR(ValueError, std::string(env) + "='" + raw + "' is not a number of " + what);
    return std::floor(number);
  }
  if (!(*value >= 0)) C10_THROW_ERROR(ValueError, std::string("the ceiling on ") + what + " must be non-negative");
  return *value;
}

// ---- per-kind costs (ir/cost.py), at every dim's largest value ---------------------------------------------

struct Sizes {
  const Layer& layer;
  const std::vector<TensorInfo>& tensors;
  const std::vector<int64_t>& hi;
  const TensorInfo& in(size_t k) const { return tensors[layer.inputs[k]]; }
  const TensorInfo& out(size_t k = 0) const { return tensors[layer.outputs[k]]; }
  double dim(const Dim& d) const { return (double)d.eval(hi); }
  double numel(const TensorInfo& t) const { return size(t.shape, 0, t.shape.size()); }
  double size(const Shape& s, size_t from, size_t to) const {
    double n = 1;
    for (size_t k = from; k < to; ++k) n *= std::max(dim(s[k]), 0.0);
    return n;
  }
  double nbytes(const TensorInfo& t) const { return numel(t) * at::elementSize(t.dtype); }
  double last(const TensorInfo& t, size_t n) const {
    return t.shape.empty() ? 1.0 : size(t.shape, t.shape.size() - std::min(n, t.shape.size()), t.shape.size());
  }
  double touched() const {
    double n = 0;
    for (size_t k = 0; k < layer.inputs.size(); ++k) n += numel(in(k));
    for (size_t k = 0; k < layer.outputs.size(); ++k) n += numel(out(k));
    return n;
  }
};

double einsum_extents(const std::string& equation, const Sizes& z) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  std::string lhs = eq.substr(0, eq.find("->"));
  std::vector<std::string> terms;
  size_t start = 0;
  for (size_t k = 0; k <= lhs.size(); ++k)
    if (k == lhs.size() || lhs[k] == ',') terms.push_back(lhs.substr(start, k - start)), start = k + 1;
  std::map<char, double> extent;
  std::vector<std::vector<double>> ellipses;
  for (size_t t = 0; t < terms.size() && t < z.layer.inputs.size(); ++t) {
    std::vector<double> dims;
    for (const Dim& d : z.in(t).shape) dims.push_back(z.dim(d));
    const std::string& term = terms[t];
    size_t dots = term.find("...");
    std::string before = dots == std::string::npos ? term : term.substr(0, dots);
    std::string after = dots == std::string::npos ? "" : term.substr(dots + 3);
    long tail = dots == std::string::npos ? (long)dims.size() : (long)dims.size() - (long)after.size();
    if (dots != std::string::npos && tail >= (long)before.size())
      ellipses.emplace_back(dims.begin() + before.size(), dims.begin() + tail);
    std::string letters = before + after;
    std::vector<double> picked(dims.begin(), dims.begin() + std::min(before.size(), dims.size()));
    for (long k = std::max(tail, 0L); k < (long)dims.size(); ++k) picked.push_back(dims[k]);
    for (size_t k = 0; k < letters.size() && k < picked.size(); ++k)
      extent[letters[k]] = std::max(extent.count(letters[k]) ? extent[letters[k]] : 1.0, picked[k]);
  }
  size_t width = 0;
  for (auto& e : ellipses) width = std::max(width, e.size());
  double product = 1;
  for (auto& [c, e] : extent) product *= std::max(e, 0.0);
  for (size_t i = 0; i < width; ++i) {
    double m = 1;
    for (auto& e : ellipses)
      if ((long)i - (long)width + (long)e.size() >= 0) m = std::max(m, e[i - width + e.size()]);
    product *= m;
  }
  return product;
}

void attention_sizes(const Sizes& z, double& rows, double& keys, double& length) {
  const TensorInfo &k = z.in(1), &y = z.out();
  rows = y.shape.empty() ? 1.0 : z.size(y.shape, 0, y.shape.size() - 1);
  keys = k.shape.size() >= 2 ? z.dim(k.shape[k.shape.size() - 2]) : 1.0;
  length = y.shape.size() >= 2 ? z.dim(y.shape[y.shape.size() - 2]) : 1.0;
}

double flops(const Sizes& z);
double workspace(const Sizes& z);

// ---- control flow: what its sub-networks cost ----

double network_flops(const Network& n, const std::vector<int64_t>& hi) {  // its layers' sum
  double total = 0;
  for (const Layer& layer : n.layers) total += flops(Sizes{layer, n.tensors, hi});
  return total;
}

// What running a sub-network may hold at once, bounded above by every tensor it makes and its layers' largest
// workspace together.
double network_bytes(const Network& n, const std::vector<int64_t>& hi) {
  double made = 0, weights = 0, most = 0;
  for (const Layer& layer : n.layers) {
    Sizes z{layer, n.tensors, hi};
    if (layer.kind != "constant")
      for (size_t k = 0; k < layer.outputs.size(); ++k) made += z.nbytes(z.out(k));
    for (const auto& [key, w] : layer.weights) weights += (double)w.numel() * w.element_size();
    most = std::max(most, workspace(z));
  }
  return made + weights + most;
}

double flops(const Sizes& z) {
  const Layer& l = z.layer;
  const std::string& kind = l.kind;
  if (kind == "constant") return 0;
  if (kind == "shape") return z.numel(z.out());
  if (kind == "convolution") {
    const at::Tensor& kernel = l.weights.at("kernel");
    double taps = (double)kernel.size(1);
    for (int64_t d = 2; d < kernel.dim(); ++d) taps *= (double)kernel.size(d);
    return 2 * z.numel(l.flag("transposed") ? z.in(0) : z.out()) * taps + z.numel(z.out());
  }
  if (kind == "matrix_multiply") {
    const TensorInfo& a = z.in(0);
    double k = a.shape.empty() ? 1.0 : z.dim(a.shape.back());
    if (a.shape.size() >= 2 && l.str("op0") == "transpose") k = z.dim(a.shape[a.shape.size() - 2]);
    double out = z.numel(z.out());
    return 2 * out * k + out;
  }
  if (kind == "einsum")
    return 2 * einsum_extents(l.str("equation"), z) * std::max<double>(1, (double)l.inputs.size() - 1);
  if (kind == "attention") {
    double rows, keys, length;
    attention_sizes(z, rows, keys, length);
    return rows * keys * (2 * (z.last(z.in(0), 1) + z.last(z.in(2), 1)) + 5) + z.touched();
  }
  if (kind == "pooling") {
    double window = 1;
    for (const Param& w : l.param("window").list) window *= (double)w.i.value;
    return z.numel(z.out()) * window + z.numel(z.in(0));
  }
  if (kind == "resize" || kind == "grid_sample") return 16 * z.numel(z.out()) + z.touched();
  if (kind == "topk")
    return z.numel(z.in(0)) * (1 + std::log2(std::max((double)l.param("k").i.value, 1.0) + 1)) + z.touched();
  if (kind == "unique") return z.numel(z.in(0)) * (1 + std::log2(z.numel(z.in(0)) + 1)) + z.touched();
  if (kind == "conditional")
    return std::max(network_flops(*l.subnetworks[0], z.hi), network_flops(*l.subnetworks[1], z.hi));
  if (kind == "loop") {  // every iteration it may run (at most max_trips), the body and the copy of what it carries
    double carried = 0;
    for (size_t k = 0; k < l.outputs.size(); ++k) carried += z.numel(z.out(k));
    return (double)l.param("max_trips").i.value * (network_flops(*l.subnetworks[0], z.hi) + carried + 1);
  }
  return z.touched();
}

double workspace(const Sizes& z) {
  const Layer& l = z.layer;
  const std::string& kind = l.kind;
  auto wide = [](at::ScalarType t) { return (double)std::max<size_t>(at::elementSize(t), 4); };
  if (kind == "fill") return 3 * 8 * std::max(z.dim(l.param("length").i), 0.0);
  if (kind == "slice") {
    const TensorInfo& x = z.in(0);
    std::vector<double> dims;
    for (const Dim& d : x.shape) dims.push_back(std::max(z.dim(d), 0.0));
    const auto &count = l.param("shape").list, &step = l.param("stride").list;
    double total = 0;
    for (size_t d = 0; d < count.size() && d < step.size() && d < dims.size(); ++d)
      if (z.dim(step[d].i) < 0) {
        dims[d] = z.dim(count[d].i);
        total += std::accumulate(dims.begin(), dims.end(), 1.0, std::multiplies<double>()) * at::elementSize(x.dtype) +
                 8 * std::max(dims[d], 0.0);
      }
    return total;
  }
  if (kind == "attention") {
    double rows, keys, length;
    attention_sizes(z, rows, keys, length);
    double width = wide(z.in(0).dtype);
    double mask = l.inputs.size() > 3 ? z.numel(z.in(3)) : 0.0;
    double causal = l.flag("causal") ? length * keys * (1 + width) : 0.0;
    return width * (3 * rows * keys + mask) + causal + z.nbytes(z.in(0)) + z.nbytes(z.in(1)) + z.nbytes(z.in(2));
  }
  if (kind == "convolution") {
    const at::Tensor& kernel = l.weights.at("kernel");
    const TensorInfo &x = z.in(0), &y = z.out();
    if (x.dtype == at::kFloat && std::max(z.numel(x), z.numel(y)) < (double)(int64_t(1) << 31))
      return 2 * (z.nbytes(x) + z.nbytes(y));
    double taps = 1;
    for (int64_t d = 2; d < kernel.dim(); ++d) taps *= (double)kernel.size(d);
    bool transposed = l.flag("transposed");
    double groups = (double)l.param("groups").i.value;
    double in_ch = transposed ? (double)kernel.size(0) : (double)kernel.size(1) * groups;
    double out_ch = transposed ? (double)kernel.size(1) * groups : (double)kernel.size(0);
    double per = transposed ? in_ch : out_ch;
    double positions = per ? z.numel(transposed ? x : y) / per : 0.0;
    return 1.5 * positions * (transposed ? out_ch : in_ch) * taps * at::elementSize(x.dtype);
  }
  if (kind == "matrix_multiply") {
    const TensorInfo &a = z.in(0), &b = z.in(1), &y = z.out();
    double bias = l.weights.count("bias") ? z.nbytes(y) : 0.0;
    if (b.shape.size() <= 2) return z.nbytes(a) + bias;
    double batch = z.size(y.shape, 0, y.shape.size() - 2);
    return batch * (z.last(a, 2) * at::elementSize(a.dtype) + z.last(b, 2) * at::elementSize(b.dtype)) + bias;
  }
  if (kind == "einsum") {
    double copies = z.nbytes(z.out());
    for (size_t k = 0; k < l.inputs.size(); ++k) copies += z.nbytes(z.in(k));
    double chained = std::max<double>((double)l.inputs.size() - 2, 0) * einsum_extents(l.str("equation"), z);
    return copies + chained * at::elementSize(z.out().dtype);
  }
  if (kind == "resize") {
    double tables = 0;
    for (size_t d = 2; d < z.out().shape.size(); ++d) tables += z.dim(z.out().shape[d]);
    return 64 * tables + (at::isFloatingType(z.in(0).dtype) ? 0.0 : 8 * z.numel(z.out()));
  }
  if (kind == "pooling") return l.str("type") == "max" ? 8 * z.numel(z.out()) : 0.0;
  if (kind == "softmax" || kind == "normalization") return 2 * z.numel(z.in(0)) * wide(z.in(0).dtype);
  if (kind == "scale") return 2 * z.nbytes(z.out());
  if (kind == "elementwise" || kind == "unary" || kind == "activation" || kind == "select" ||
      kind == "parametric_relu") {
    at::ScalarType common = z.in(0).dtype;
    for (size_t k = 1; k < l.inputs.size(); ++k) common = c10::promoteTypes(common, z.in(k).dtype);
    for (size_t k = 0; k < l.outputs.size(); ++k)
      if (z.out(k).dtype != at::kBool) common = c10::promoteTypes(common, z.out(k).dtype);
    double n = 0;
    for (size_t k = 0; k < l.inputs.size(); ++k)
      if (z.in(k).dtype != common) n += z.numel(z.in(k)) * at::elementSize(common);
    return n;
  }
  if (kind == "padding") return l.str("mode") == "constant" ? 0.0 : z.nbytes(z.out());
  if (kind == "reduce") {
    if (l.str("op") == "prod" && l.param("axes").list.size() > 1) return z.nbytes(z.in(0));
    return 8 * z.numel(z.out());
  }
  if (kind == "gather") return z.numel(z.in(1)) * (3 + at::elementSize(z.in(1).dtype));
  if (kind == "topk") return z.numel(z.in(0)) * (at::elementSize(z.in(0).dtype) + 8);
  if (kind == "unique") return z.numel(z.in(0)) * (at::elementSize(z.in(0).dtype) + 16);
  if (kind == "conditional")
    return std::max(network_bytes(*l.subnetworks[0], z.hi), network_bytes(*l.subnetworks[1], z.hi));
  if (kind == "loop") return network_bytes(*l.subnetworks[0], z.hi);  // an iteration's tensors go when the next starts
  return 0;
}

std::string count(double n) {
  if (!std::isfinite(n)) return std::isnan(n) ? "nan" : "inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", std::floor(n));
  return buf;
}

std::string g3(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", n);
  return buf;
}

}  // namespace

double max_engine_memory(std::optional<double> value, const std::string& device_type) {
  return ceiling(value, "TORCHKILN_MAX_ENGINE_MEMORY", "bytes", std::floor(kCpuMemoryShare * cpu_memory()));
}

double max_engine_flops(std::optional<double> value, const std::string& device_type) {
  return ceiling(value, "TORCHKILN_MAX_ENGINE_FLOPS", "FLOPs", kComputeSeconds * kCpuCoreFlops * cpu_cores());
}

Budget::Budget(double max_memory, double max_flops, const std::vector<std::vector<std::string>>& reads,
               const std::vector<std::string>& kept)
    : max_memory_(max_memory), max_flops_(max_flops), kept_(kept.begin(), kept.end()) {
  for (size_t i = 0; i < reads.size(); ++i)
    for (const auto& name : reads[i]) reads_[name] = i;
  for (const auto& [name, i] : reads_) frees_[i].push_back(name);
}

void Budget::add(size_t index, const Layer& layer, const std::vector<TensorInfo>& tensors,
                 const std::vector<int64_t>& highest, const std::string& where) {
  for (const auto& [k, w] : layer.weights)
    if (weights_.insert(w.unsafeGetTensorImpl()).second) weight_bytes_ += (double)w.numel() * w.element_size();
  Sizes z{layer, tensors, highest};
  std::vector<std::string> made;
  if (layer.kind != "constant")
    for (int s : layer.outputs) {
      double n = z.nbytes(tensors[s]);
      live_[tensors[s].name] = n;
      live_bytes_ += n;
      made.push_back(tensors[s].name);
    }
  double work = workspace(z);
  double need = weight_bytes_ + live_bytes_ + work;
  if (!(need <= max_memory_))
    format_error(where + ": the engine plans " + count(need) + " bytes at this layer (weights " + count(weight_bytes_) +
                 ", live tensors " + count(live_bytes_) + ", the layer's workspace " + count(work) + "), over the " +
                 count(max_memory_) +
                 "-byte limit (raise it with Engine.deserialize(max_memory=...) or "
                 "TORCHKILN_MAX_ENGINE_MEMORY)");
  flops_ += flops(z);
  if (!(flops_ <= max_flops_))
    format_error(where + ": the engine plans " + g3(flops_) + " FLOPs per call by this layer, over the limit of " +
                 g3(max_flops_) + " (raise it with Engine.deserialize(max_flops=...) or TORCHKILN_MAX_ENGINE_FLOPS)");
  std::vector<std::string> done = frees_[index];
  frees_.erase(index);
  for (const auto& name : made)
    if (!reads_.count(name)) done.push_back(name);
  for (const auto& name : done) {
    auto it = live_.find(name);
    if (!kept_.count(name) && it != live_.end()) {
      live_bytes_ -= it->second;
      live_.erase(it);
    }
  }
}

}  // namespace torchkiln
