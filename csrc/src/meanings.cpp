// Every layer kind's meaning as ATen calls: the C++ form of ir/reference.py and ir/pointwise.py (and of the
// reference executor's convolution, runtime/executor.py), call for call, so that the outputs are the Python
// runtime's bit for bit. Also each kind's checks before shape inference (ir/layers.py's validate).
#include <cmath>
#include <functional>
#include <set>

#include "kinds.h"
#include "torchkiln/engine.h"

namespace torchkiln {
namespace {

using Tensors = std::vector<at::Tensor>;

// A meaning's own refusal (a NetworkError in Python): the loader prefixes where.
[[noreturn]] void refuse(const Layer& l, const std::string& problem) {
  format_error(l.kind + " layer '" + l.name + "': " + problem);
}

at::ScalarType dtype_of(const std::string& name) { return kinds().dtypes.at(name); }

at::Tensor upcast(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16 ? x.to(at::kFloat) : x;
}

std::optional<at::Tensor> maybe(const Layer& l, const std::string& key) {
  const at::Tensor* w = l.weight(key);
  return w ? std::optional<at::Tensor>(*w) : std::nullopt;
}

// ---- pointwise families (ir/pointwise.py) -----------------------------------------------------------------

using Binary = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
using Unary = std::function<at::Tensor(const at::Tensor&)>;
using Activation = std::function<at::Tensor(const at::Tensor&, double, double)>;

const std::map<std::string, Binary>& elementwise() {
  static const std::map<std::string, Binary> table = {
      {"sum", [](auto& a, auto& b) { return at::add(a, b); }},
      {"prod", [](auto& a, auto& b) { return at::mul(a, b); }},
      {"max", [](auto& a, auto& b) { return at::maximum(a, b); }},
      {"min", [](auto& a, auto& b) { return at::minimum(a, b); }},
      {"sub", [](auto& a, auto& b) { return at::sub(a, b); }},
      {"div", [](auto& a, auto& b) { return at::div(a, b); }},
      {"floor_div", [](auto& a, auto& b) { return at::div(a, b, "floor"); }},
      {"trunc_div", [](auto& a, auto& b) { return at::div(a, b, "trunc"); }},
      {"pow", [](auto& a, auto& b) { return at::pow(a, b); }},
      {"remainder", [](auto& a, auto& b) { return at::remainder(a, b); }},
      {"fmod", [](auto& a, auto& b) { return at::fmod(a, b); }},
      {"atan2", [](auto& a, auto& b) { return at::atan2(a, b); }},
      {"and", [](auto& a, auto& b) { return at::logical_and(a, b); }},
      {"or", [](auto& a, auto& b) { return at::logical_or(a, b); }},
      {"xor", [](auto& a, auto& b) { return at::logical_xor(a, b); }},
      {"equal", [](auto& a, auto& b) { return at::eq(a, b); }},
      {"not_equal", [](auto& a, auto& b) { return at::ne(a, b); }},
      {"greater", [](auto& a, auto& b) { return at::gt(a, b); }},
      {"greater_equal", [](auto& a, auto& b) { return at::ge(a, b); }},
      {"less", [](auto& a, auto& b) { return at::lt(a, b); }},
      {"less_equal", [](auto& a, auto& b) { return at::le(a, b); }},
      {"bitwise_and", [](auto& a, auto& b) { return at::bitwise_and(a, b); }},
      {"bitwise_or", [](auto& a, auto& b) { return at::bitwise_or(a, b); }},
      {"bitwise_xor", [](auto& a, auto& b) { return at::bitwise_xor(a, b); }},
      {"zeta", [](auto& a, auto& b) { return at::special_zeta(a, b); }},
      {"igamma", [](auto& a, auto& b) { return at::igamma(a, b); }},
      {"igammac", [](auto& a, auto& b) { return at::igammac(a, b); }},
      {"nextafter", [](auto& a, auto& b) { return at::nextafter(a, b); }},
      {"copysign", [](auto& a, auto& b) { return at::copysign(a, b); }},
      {"heaviside", [](auto& a, auto& b) { return at::heaviside(a, b); }},
      {"logaddexp2", [](auto& a, auto& b) { return at::logaddexp2(a, b); }},
      {"ldexp", [](auto& a, auto& b) { return at::ldexp(a, b); }},
      {"xlog1py", [](auto& a, auto& b) { return at::special_xlog1py(a, b); }},
      {"chebyshev_t", [](auto& a, auto& b) { return at::special_chebyshev_polynomial_t(a, b); }},
      {"chebyshev_u", [](auto& a, auto& b) { return at::special_chebyshev_polynomial_u(a, b); }},
      {"chebyshev_v", [](auto& a, auto& b) { return at::special_chebyshev_polynomial_v(a, b); }},
      {"chebyshev_w", [](auto& a, auto& b) { return at::special_chebyshev_polynomial_w(a, b); }},
      {"shifted_chebyshev_t", [](auto& a, auto& b) { return at::special_shifted_chebyshev_polynomial_t(a, b); }},
      {"shifted_chebyshev_u", [](auto& a, auto& b) { return at::special_shifted_chebyshev_polynomial_u(a, b); }},
      {"shifted_chebyshev_v", [](auto& a, auto& b) { return at::special_shifted_chebyshev_polynomial_v(a, b); }},
      {"shifted_chebyshev_w", [](auto& a, auto& b) { return at::special_shifted_chebyshev_polynomial_w(a, b); }},
      {"hermite_h", [](auto& a, auto& b) { return at::special_hermite_polynomial_h(a, b); }},
      {"hermite_he", [](auto& a, auto& b) { return at::special_hermite_polynomial_he(a, b); }},
      {"laguerre_l", [](auto& a, auto& b) { return at::special_laguerre_polynomial_l(a, b); }},
      {"legendre_p", [](auto& a, auto& b) { return at::special_legendre_polynomial_p(a, b); }},
  };
  return table;
}

const std::map<std::string, Unary>& unary() {
  static const std::map<std::string, Unary> table = {
      {"exp", [](auto& x) { return at::exp(x); }},
      {"expm1", [](auto& x) { return at::expm1(x); }},
      {"log", [](auto& x) { return at::log(x); }},
      {"log2", [](auto& x) { return at::log2(x); }},
      {"log10", [](auto& x) { return at::log10(x); }},
      {"log1p", [](auto& x) { return at::log1p(x); }},
      {"sqrt", [](auto& x) { return at::sqrt(x); }},
      {"rsqrt", [](auto& x) { return at::rsqrt(x); }},
      {"recip", [](auto& x) { return at::reciprocal(x); }},
      {"abs", [](auto& x) { return at::abs(x); }},
      {"neg", [](auto& x) { return at::neg(x); }},
      {"sin", [](auto& x) { return at::sin(x); }},
      {"cos", [](auto& x) { return at::cos(x); }},
      {"tan", [](auto& x) { return at::tan(x); }},
      {"sinh", [](auto& x) { return at::sinh(x); }},
      {"cosh", [](auto& x) { return at::cosh(x); }},
      {"asin", [](auto& x) { return at::asin(x); }},
      {"acos", [](auto& x) { return at::acos(x); }},
      {"atan", [](auto& x) { return at::atan(x); }},
      {"asinh", [](auto& x) { return at::asinh(x); }},
      {"acosh", [](auto& x) { return at::acosh(x); }},
      {"atanh", [](auto& x) { return at::atanh(x); }},
      {"ceil", [](auto& x) { return at::ceil(x); }},
      {"floor", [](auto& x) { return at::floor(x); }},
      {"round", [](auto& x) { return at::round(x); }},
      {"trunc", [](auto& x) { return at::trunc(x); }},
      {"erf", [](auto& x) { return at::erf(x); }},
      {"erfinv", [](auto& x) { return at::erfinv(x); }},
      {"sign", [](auto& x) { return at::sign(x); }},
      {"not", [](auto& x) { return at::logical_not(x); }},
      {"bitwise_not", [](auto& x) { return at::bitwise_not(x); }},
      {"isinf", [](auto& x) { return at::isinf(x); }},
      {"isneginf", [](auto& x) { return at::isneginf(x); }},
      {"isposinf", [](auto& x) { return at::isposinf(x); }},
      {"isnan", [](auto& x) { return at::isnan(x); }},
      {"isfinite", [](auto& x) { return at::isfinite(x); }},
      {"square", [](auto& x) { return at::square(x); }},
      {"signbit", [](auto& x) { return at::signbit(x); }},
      {"lgamma", [](auto& x) { return at::lgamma(x); }},
      {"digamma", [](auto& x) { return at::digamma(x); }},
      {"erfc", [](auto& x) { return at::erfc(x); }},
      {"erfcx", [](auto& x) { return at::special_erfcx(x); }},
      {"sinc", [](auto& x) { return at::sinc(x); }},
      {"i0", [](auto& x) { return at::i0(x); }},
      {"i0e", [](auto& x) { return at::special_i0e(x); }},
      {"i1", [](auto& x) { return at::special_i1(x); }},
      {"i1e", [](auto& x) { return at::special_i1e(x); }},
      {"ndtr", [](auto& x) { return at::special_ndtr(x); }},
      {"ndtri", [](auto& x) { return at::special_ndtri(x); }},
      {"log_ndtr", [](auto& x) { return at::special_log_ndtr(x); }},
      {"entr", [](auto& x) { return at::special_entr(x); }},
      {"airy_ai", [](auto& x) { return at::special_airy_ai(x); }},
      {"bessel_j0", [](auto& x) { return at::special_bessel_j0(x); }},
      {"bessel_j1", [](auto& x) { return at::special_bessel_j1(x); }},
      {"bessel_y0", [](auto& x) { return at::special_bessel_y0(x); }},
      {"bessel_y1", [](auto& x) { return at::special_bessel_y1(x); }},
      {"modified_bessel_i0", [](auto& x) { return at::special_modified_bessel_i0(x); }},
      {"modified_bessel_i1", [](auto& x) { return at::special_modified_bessel_i1(x); }},
      {"modified_bessel_k0", [](auto& x) { return at::special_modified_bessel_k0(x); }},
      {"modified_bessel_k1", [](auto& x) { return at::special_modified_bessel_k1(x); }},
      {"scaled_modified_bessel_k0", [](auto& x) { return at::special_scaled_modified_bessel_k0(x); }},
      {"scaled_modified_bessel_k1", [](auto& x) { return at::special_scaled_modified_bessel_k1(x); }},
      {"spherical_bessel_j0", [](auto& x) { return at::special_spherical_bessel_j0(x); }},
  };
  return table;
}

at::Tensor clip(const at::Tensor& x, double lo, double hi) {  // pointwise._clip
  auto bound = [&](double v) -> std::optional<at::Scalar> {
    if (std::isinf(v)) return std::nullopt;
    if (!at::isFloatingType(x.scalar_type()) && std::floor(v) == v) return at::Scalar((int64_t)v);
    return at::Scalar(v);
  };
  return at::clamp(x, bound(lo), bound(hi));
}

const std::map<std::string, Activation>& activations() {
  static const std::map<std::string, Activation> table = {
      {"relu", [](auto& x, double, double) { return at::relu(x); }},
      {"sigmoid", [](auto& x, double, double) { return at::sigmoid(x); }},
      {"tanh", [](auto& x, double, double) { return at::tanh(x); }},
      {"leaky_relu", [](auto& x, double a, double) { return at::leaky_relu(x, a); }},
      {"elu", [](auto& x, double a, double) { return at::elu(x, a); }},
      {"selu", [](auto& x, double, double) { return at::selu(x); }},
      {"celu", [](auto& x, double a, double) { return at::celu(x, a); }},
      {"softsign", [](auto& x, double, double) { return x / (x.abs() + 1); }},
      {"softplus", [](auto& x, double a, double b) { return at::softplus(x, a, b); }},
      {"clip", [](auto& x, double a, double b) { return clip(x, a, b); }},
      {"hard_sigmoid", [](auto& x, double, double) { return at::hardsigmoid(x); }},
      {"hard_swish", [](auto& x, double, double) { return at::hardswish(x); }},
      {"hard_tanh", [](auto& x, double a, double b) { return at::hardtanh(x, a, b); }},
      {"thresholded_relu", [](auto& x, double a, double b) { return at::threshold(x, a, b); }},
      {"gelu_erf", [](auto& x, double, double) { return at::gelu(x); }},
      {"gelu_tanh", [](auto& x, double, double) { return at::gelu(x, "tanh"); }},
      {"silu", [](auto& x, double, double) { return at::silu(x); }},
      {"mish", [](auto& x, double, double) { return at::mish(x); }},
      {"log_sigmoid", [](auto& x, double, double) { return at::log_sigmoid(x); }},
      {"polygamma", [](auto& x, double a, double) { return at::polygamma((int64_t)a, x); }},
      {"mvlgamma", [](auto& x, double a, double) { return at::mvlgamma(x, (int64_t)a); }},
  };
  return table;
}

// ---- the meanings (ir/reference.py) ----------------------------------------------------------------------

Tensors constant(const Layer& l, const Tensors&, const Env&) { return {l.weights.at("value")}; }

Tensors identity(const Layer&, const Tensors& xs, const Env&) { return {xs[0]}; }

Tensors cast(const Layer& l, const Tensors& xs, const Env&) { return {xs[0].to(dtype_of(l.str("to_type")))}; }

Tensors convolution(const Layer& l, const Tensors& xs, const Env& env) {  // executor.convolve, TF32 refused
  const at::Tensor& kernel = l.weights.at("kernel");
  auto output_padding = l.ints("output_padding", env);
  if (output_padding.empty()) output_padding.assign(kernel.dim() - 2, 0);
  auto& ctx = at::globalContext();
  return {at::_convolution(xs[0], kernel, maybe(l, "bias"), l.ints("stride", env), l.ints("padding", env),
                           l.ints("dilation", env), l.flag("transposed"), output_padding, l.integer("groups", env),
                           ctx.benchmarkCuDNN(), ctx.deterministicCuDNN() || ctx.deterministicAlgorithms(),
                           ctx.userEnabledCuDNN(), false)};
}

// ---- quantization (ir/reference.py: quantize, dequantize) --------------------------------------------------

std::pair<double, double> quant_range(at::ScalarType t) {  // layers.QUANT_RANGE
  return t == at::kChar ? std::pair<double, double>{-128.0, 127.0} : std::pair<double, double>{-448.0, 448.0};
}

at::Tensor quant_shaped(const Layer& l, const at::Tensor& w, int64_t rank) {  // _QuantizeBase.shaped
  if (!l.has("axis")) return w.reshape({});
  int64_t axis = ((l.param("axis").i.value % rank) + rank) % rank;
  std::vector<int64_t> dims{-1};
  dims.resize(rank - axis, 1);
  return w.reshape(dims);
}

Tensors quantize(const Layer& l, const Tensors& xs, const Env&) {
  int64_t rank = xs[0].dim();
  at::ScalarType type = dtype_of(l.str("quant_type"));
  at::Tensor scale = quant_shaped(l, l.weights.at("scale"), rank), x = xs[0].to(at::kFloat);
  at::Tensor scaled = l.flag("divide") ? x / scale : x * at::reciprocal(scale);
  if (type == at::kChar) {
    double lo = (double)l.param("quant_min").i.value, hi = (double)l.param("quant_max").i.value;
    at::Tensor q = at::round(scaled);
    if (const at::Tensor* zero = l.weight("zero_point")) q = q + quant_shaped(l, *zero, rank).to(at::kFloat);
    return {at::nan_to_num(q, lo).clamp(lo, hi).to(at::kChar)};
  }
  auto [lo, hi] = quant_range(type);
  return {scaled.clamp(lo, hi).to(type)};
}

Tensors dequantize(const Layer& l, const Tensors& xs, const Env&) {
  int64_t rank = xs[0].dim();
  at::Tensor x = xs[0].to(at::kFloat);
  if (const at::Tensor* zero = l.weight("zero_point")) x = x - quant_shaped(l, *zero, rank).to(at::kFloat);
  return {(x * quant_shaped(l, l.weights.at("scale"), rank)).to(dtype_of(l.str("to_type")))};
}

Tensors scale(const Layer& l, const Tensors& xs, const Env&) {
  at::Tensor x = xs[0];
  auto shaped = [&](const at::Tensor& w) {
    if (l.str("mode") != "channel") return w;
    int64_t rank = x.dim(), axis = rank ? ((l.param("channel_axis").i.value % rank) + rank) % rank : 0;
    std::vector<int64_t> dims{-1};
    dims.resize(std::max<int64_t>(rank - axis, 1), 1);
    return w.reshape(dims);
  };
  if (const at::Tensor* w = l.weight("scale")) x = x * shaped(*w);
  if (const at::Tensor* w = l.weight("shift")) x = x + shaped(*w);
  if (const at::Tensor* w = l.weight("power")) x = at::pow(x, shaped(*w));
  return {x};
}

Tensors activation(const Layer& l, const Tensors& xs, const Env&) {
  return {activations().at(l.str("type"))(xs[0], l.real("alpha"), l.real("beta"))};
}

Tensors prelu(const Layer& l, const Tensors& xs, const Env&) { return {at::prelu(xs[0], l.weights.at("slope"))}; }

Tensors binary(const Layer& l, const Tensors& xs, const Env&) { return {elementwise().at(l.str("op"))(xs[0], xs[1])}; }

Tensors unary_op(const Layer& l, const Tensors& xs, const Env&) { return {unary().at(l.str("op"))(xs[0])}; }

Tensors pooling(const Layer& l, const Tensors& xs, const Env& env) {
  auto window = l.ints("window", env), stride = l.ints("stride", env), padding = l.ints("padding", env);
  auto dilation = l.ints("dilation", env);
  size_t nd = window.size();
  if (nd < 1 || nd > 3) refuse(l, "window must be 1-, 2- or 3-d");
  bool ceil_mode = l.flag("ceil_mode");
  if (l.str("type") == "max") {
    if (dilation.empty()) dilation = {1};
    if (nd == 1) return {at::max_pool1d(xs[0], window, stride, padding, dilation, ceil_mode)};
    if (nd == 2) return {at::max_pool2d(xs[0], window, stride, padding, dilation, ceil_mode)};
    return {at::max_pool3d(xs[0], window, stride, padding, dilation, ceil_mode)};
  }
  for (int64_t d : dilation)
    if (d != 1) refuse(l, "average pooling has no dilation");
  bool include = l.flag("count_include_pad");
  std::optional<int64_t> divisor;
  if (l.has("divisor_override")) divisor = l.integer("divisor_override", env);
  if (nd == 1) {
    if (divisor) refuse(l, "1-d average pooling has no divisor_override");
    return {at::avg_pool1d(xs[0], window, stride, padding, ceil_mode, include)};
  }
  if (nd == 2) return {at::avg_pool2d(xs[0], window, stride, padding, ceil_mode, include, divisor)};
  return {at::avg_pool3d(xs[0], window, stride, padding, ceil_mode, include, divisor)};
}

Tensors matmul(const Layer& l, const Tensors& xs, const Env&) {
  at::Tensor a = xs[0], b = xs[1];
  auto bias = maybe(l, "bias");
  const std::string &op0 = l.str("op0"), &op1 = l.str("op1");
  if (op0 == "none" && op1 == "transpose" && b.dim() == 2 && a.dim() >= 1 && (!bias || bias->dim() <= 1))
    return {at::linear(a, b, bias)};
  if (op0 == "none" && op1 == "none" && b.dim() == 2 && a.dim() >= 2 && bias && bias->dim() <= 1 &&
      a.is_floating_point()) {
    at::Tensor out = at::addmm(*bias, a.reshape({-1, a.size(-1)}), b);
    std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end() - 1);
    shape.push_back(b.size(-1));
    return {out.reshape(shape)};
  }
  if (op0 == "transpose") a = a.transpose(-1, -2);
  if (op1 == "transpose") b = b.transpose(-1, -2);
  at::Tensor out = at::matmul(a, b);
  return {bias ? out + *bias : out};
}

Tensors shuffle(const Layer& l, const Tensors& xs, const Env& env) {
  at::Tensor x = xs[0];
  if (l.has("first_transpose")) x = x.permute(l.ints("first_transpose", env));
  if (l.has("reshape_dims")) {
    auto dims = l.ints("reshape_dims", env);
    for (size_t i = 0; i < dims.size(); ++i)
      if (dims[i] == 0 && l.flag("zero_is_placeholder")) dims[i] = x.size(i);
    x = x.reshape(dims);
  }
  if (l.has("second_transpose")) x = x.permute(l.ints("second_transpose", env));
  return {x};
}

Tensors reduce(const Layer& l, const Tensors& xs, const Env& env) {
  at::Tensor x = xs[0];
  auto axes = l.ints("axes", env);
  bool keep = l.flag("keep_dims");
  if (axes.empty()) refuse(l, "needs at least one axis");
  const std::string& op = l.str("op");
  if (op == "sum") return {at::sum(x, axes, keep)};
  if (op == "avg") return {at::mean(x, axes, keep)};
  if (op == "max") return {at::amax(x, axes, keep)};
  if (op == "min") return {at::amin(x, axes, keep)};
  if (op == "any") return {at::any(x, at::OptionalIntArrayRef(at::IntArrayRef(axes)), keep)};
  if (op == "all") return {at::all(x, at::OptionalIntArrayRef(at::IntArrayRef(axes)), keep)};
  int64_t rank = x.dim();
  for (auto& a : axes) a = rank ? ((a % rank) + rank) % rank : 0;
  std::sort(axes.rbegin(), axes.rend());
  for (int64_t a : axes) x = at::prod(x, a, keep);
  return {x};
}

Tensors softmax(const Layer& l, const Tensors& xs, const Env&) {
  int64_t axis = l.param("axis").i.value;
  at::Tensor y = l.flag("log") ? at::log_softmax(upcast(xs[0]), axis) : at::softmax(upcast(xs[0]), axis);
  return {y.to(xs[0].scalar_type())};
}

Tensors concatenation(const Layer& l, const Tensors& xs, const Env&) { return {at::cat(xs, l.param("axis").i.value)}; }

Tensors slice(const Layer& l, const Tensors& xs, const Env& env) {
  at::Tensor x = xs[0];
  auto start = l.ints("start", env), shape = l.ints("shape", env), stride = l.ints("stride", env);
  if (!(start.size() == shape.size() && shape.size() == stride.size() && stride.size() == (size_t)x.dim()))
    refuse(l, "start/shape/stride must have one entry per dim");
  std::vector<std::array<int64_t, 3>> index;
  for (int64_t dim = 0; dim < x.dim(); ++dim) {
    int64_t s = start[dim], size = shape[dim], step = stride[dim];
    if (step == 0) refuse(l, "stride 0 on dim " + std::to_string(dim));
    int64_t last = s + (size - 1) * step;
    if (size && !(0 <= last && last < x.size(dim)))
      refuse(l, "dim " + std::to_string(dim) + " of size " + std::to_string(x.size(dim)) + " has no " +
                    std::to_string(size) + " elements from " + std::to_string(s) + " by " + std::to_string(step));
    if (step > 0) {
      index.push_back({s, size ? last + 1 : s, step});
    } else {
      at::Tensor idx = at::add(at::mul(at::arange(size, x.options().dtype(at::kLong)), step), s);
      x = x.index_select(dim, idx);
      index.push_back({0, INT64_MAX, 1});
    }
  }
  for (int64_t dim = 0; dim < x.dim(); ++dim) x = x.slice(dim, index[dim][0], index[dim][1], index[dim][2]);
  return {x};
}

Tensors expand(const Layer& l, const Tensors& xs, const Env& env) { return {xs[0].expand(l.ints("shape", env))}; }

void check_indices(const Layer& l, const at::Tensor& idx, int64_t dim, int64_t size, const Env& env) {
  if (env.meta || env.capturing || idx.numel() == 0) return;
  at::Tensor bad = at::logical_or(idx < 0, idx >= size);
  if (bad.any().item<bool>()) {
    int64_t value = idx.masked_select(bad).flatten()[0].item<int64_t>();
    index_error("gather layer '" + l.name + "': index " + std::to_string(value) + " is out of range for dim " +
                std::to_string(dim) + " of size " + std::to_string(size) + "; valid indices are 0.." +
                std::to_string(size - 1));
  }
}

// A gather's indices against the sizes of its data (EngineIndexError naming the first one out of range).
void check_gather(const Layer& l, at::IntArrayRef data, const at::Tensor& idx, const Env& env) {
  int64_t rank = std::max<int64_t>(static_cast<int64_t>(data.size()), 1), axis = l.param("axis").i.value;
  int64_t norm = ((axis % rank) + rank) % rank;
  auto size = [&](int64_t dim) { return data.empty() ? int64_t{1} : data[dim]; };
  if (l.str("mode") == "nd") {
    for (int64_t dim = 0; dim < idx.size(-1); ++dim) check_indices(l, idx.select(-1, dim), dim, size(dim), env);
  } else {
    check_indices(l, idx, norm, size(norm), env);
  }
}

Tensors gather(const Layer& l, const Tensors& xs, const Env& env) {
  const at::Tensor &data = xs[0], &idx = xs[1];
  int64_t axis = l.param("axis").i.value;
  const std::string& mode = l.str("mode");
  int64_t rank = std::max<int64_t>(data.dim(), 1);
  int64_t norm = ((axis % rank) + rank) % rank;
  check_gather(l, data.sizes(), idx, env);
  if (mode == "element") return {at::gather(data, axis, idx)};
  if (mode == "nd") {
    c10::List<std::optional<at::Tensor>> indices;
    at::Tensor moved = idx.movedim(-1, 0);
    for (int64_t k = 0; k < moved.size(0); ++k) indices.push_back(moved[k]);
    return {at::index(data, indices)};
  }
  at::Tensor flat = at::index_select(data, norm, idx.reshape(-1));
  std::vector<int64_t> shape(data.sizes().begin(), data.sizes().begin() + norm);
  shape.insert(shape.end(), idx.sizes().begin(), idx.sizes().end());
  shape.insert(shape.end(), data.sizes().begin() + norm + 1, data.sizes().end());
  return {flat.reshape(shape)};
}

Tensors scatter(const Layer& l, const Tensors& xs, const Env&) {
  return {at::scatter(xs[0], l.param("axis").i.value, xs[1], xs[2])};
}

Tensors select(const Layer&, const Tensors& xs, const Env&) { return {at::where(xs[0], xs[1], xs[2])}; }

Tensors topk(const Layer& l, const Tensors& xs, const Env& env) {
  bool largest = l.str("op") == "max";
  int64_t k = l.integer("k", env), axis = l.param("axis").i.value;
  if (k == 1) {
    auto [values, indices] = largest ? at::max(xs[0], axis, true) : at::min(xs[0], axis, true);
    return {values, indices};
  }
  auto [values, indices] = at::topk(xs[0], k, axis, largest, true);
  return {values, indices};
}

// Data-dependent output sizes (ir/reference.py): at load (meta) the outputs at the largest count; when the layer
// runs, Engine::execute binds its count symbol to the size of its first output.
Tensors non_zero(const Layer& l, const Tensors& xs, const Env& env) {
  if (env.meta) return {at::empty({l.integer("count", env), xs[0].dim()}, xs[0].options().dtype(at::kLong))};
  return {at::nonzero(xs[0])};
}

Tensors unique(const Layer& l, const Tensors& xs, const Env& env) {
  if (env.meta) {
    int64_t n = l.integer("count", env);
    at::TensorOptions index = xs[0].options().dtype(at::kLong);
    return {at::empty({n}, xs[0].options()), at::empty(xs[0].sizes(), index), at::empty({n}, index)};
  }
  auto [values, inverse, counts] = l.flag("consecutive") ? at::unique_consecutive(xs[0], true, true)
                                                         : at::_unique2(xs[0], true, true, true);
  return {values, inverse, counts};
}

Tensors resize(const Layer& l, const Tensors& xs, const Env& env) {  // torch.nn.functional.interpolate
  const at::Tensor& x = xs[0];
  if (l.has("size") == l.has("scales")) refuse(l, "needs exactly one of size and scales");
  const std::string& mode = l.str("mode");
  bool exact_modes = mode == "nearest" || mode == "area" || mode == "nearest-exact";
  if (exact_modes && l.has("align_corners"))
    refuse(l,
           "align_corners option can only be set with the interpolating "
           "modes: linear | bilinear | bicubic | trilinear");
  bool align = l.has("align_corners") && l.flag("align_corners");
  int64_t dim = x.dim() - 2;
  std::optional<std::vector<int64_t>> size;
  std::optional<std::vector<double>> scales;
  if (l.has("size")) {
    size = l.ints("size", env);
    if ((int64_t)size->size() != dim) refuse(l, "input and output must have the same number of spatial dimensions");
  } else {
    std::vector<double> s;
    for (const Param& p : l.param("scales").list) s.push_back(p.f);
    if ((int64_t)s.size() != dim) refuse(l, "input and scale_factor must have the same number of spatial dimensions");
    scales = s;
  }
  if (mode == "area" && !size) {
    std::vector<int64_t> out;
    for (int64_t i = 0; i < dim; ++i) out.push_back((int64_t)std::floor((double)x.size(i + 2) * (*scales)[i]));
    size = out;
    scales.reset();
  }
  at::OptionalIntArrayRef out_size = size ? at::OptionalIntArrayRef(*size) : std::nullopt;
  std::optional<at::ArrayRef<double>> factors = scales ? std::optional<at::ArrayRef<double>>(*scales) : std::nullopt;
  if (mode == "nearest" && dim == 1) return {at::upsample_nearest1d(x, out_size, factors)};
  if (mode == "nearest" && dim == 2) return {at::upsample_nearest2d(x, out_size, factors)};
  if (mode == "nearest" && dim == 3) return {at::upsample_nearest3d(x, out_size, factors)};
  if (mode == "nearest-exact" && dim == 1) return {at::_upsample_nearest_exact1d(x, out_size, factors)};
  if (mode == "nearest-exact" && dim == 2) return {at::_upsample_nearest_exact2d(x, out_size, factors)};
  if (mode == "nearest-exact" && dim == 3) return {at::_upsample_nearest_exact3d(x, out_size, factors)};
  if (mode == "area" && dim == 1) return {at::adaptive_avg_pool1d(x, *size)};
  if (mode == "area" && dim == 2) return {at::adaptive_avg_pool2d(x, *size)};
  if (mode == "area" && dim == 3) return {at::adaptive_avg_pool3d(x, *size)};
  if (mode == "linear" && dim == 1) return {at::upsample_linear1d(x, out_size, align, factors)};
  if (mode == "bilinear" && dim == 2) return {at::upsample_bilinear2d(x, out_size, align, factors)};
  if (mode == "trilinear" && dim == 3) return {at::upsample_trilinear3d(x, out_size, align, factors)};
  if (mode == "bicubic" && dim == 2) return {at::upsample_bicubic2d(x, out_size, align, factors)};
  refuse(l, "input of rank " + std::to_string(x.dim()) + " has no " + mode + " mode");
}

Tensors padding(const Layer& l, const Tensors& xs, const Env& env) {
  const std::string& mode = l.str("mode");
  std::optional<double> value;
  if (mode == "constant") value = l.real("value");
  return {at::pad(xs[0], l.ints("pad", env), mode, value)};
}

Tensors normalization(const Layer& l, const Tensors& xs, const Env& env) {
  at::Tensor x = xs[0];
  auto scale = maybe(l, "scale"), bias = maybe(l, "bias");
  at::Tensor x32 = x;
  if (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) {
    x32 = x.to(at::kFloat);
    if (scale) scale = scale->to(at::kFloat);
    if (bias) bias = bias->to(at::kFloat);
  }
  const std::string& kind = l.str("kind");
  double eps = l.real("epsilon");
  bool cudnn = at::globalContext().userEnabledCuDNN();
  at::Tensor out;
  if (kind == "layer") {
    out = at::layer_norm(x32, l.ints("normalized_shape", env), scale, bias, eps);
  } else if (kind == "group") {
    out = at::group_norm(x32, l.integer("num_groups", env), scale, bias, eps, cudnn);
  } else {
    int64_t spatial = 1;
    for (int64_t d = 2; d < x32.dim(); ++d) spatial *= x32.size(d);
    if (spatial == 1) refuse(l, "expected more than 1 spatial element when training");
    out = at::instance_norm(x32, scale, bias, std::nullopt, std::nullopt, true, 0.1, eps, cudnn);
  }
  return {out.to(x.scalar_type())};
}

Tensors einsum(const Layer& l, const Tensors& xs, const Env&) { return {at::einsum(l.str("equation"), xs)}; }

Tensors cumulative(const Layer& l, const Tensors& xs, const Env&) {
  int64_t axis = l.param("axis").i.value;
  return {l.str("op") == "sum" ? at::cumsum(xs[0], axis) : at::cumprod(xs[0], axis)};
}

Tensors fill(const Layer& l, const Tensors&, const Env& env) {
  int64_t length = l.integer("length", env);
  if (length < 0) refuse(l, "negative length " + std::to_string(length));
  at::Tensor index = at::arange(length, at::TensorOptions().dtype(at::kDouble).device(env.device));
  return {at::add(at::mul(index, l.real("step")), l.real("start")).to(dtype_of(l.str("dtype")))};
}

Tensors shape(const Layer&, const Tensors& xs, const Env& env) {
  std::vector<int64_t> dims = xs[0].sizes().vec();
  if (!env.capturing) return {at::tensor(dims, at::TensorOptions().dtype(at::kLong)).to(env.device)};
  // captured as a CUDA graph: no copy from the host (it would wait), each size written by a fill (the captured
  // shape's sizes, as every replay of that capture has them)
  at::TensorOptions options = at::TensorOptions().dtype(at::kLong).device(env.device);
  at::Tensor out = at::empty({static_cast<int64_t>(dims.size())}, options);
  for (size_t k = 0; k < dims.size(); ++k) out.select(0, static_cast<int64_t>(k)).fill_(dims[k]);
  return {out};
}

Tensors grid_sample(const Layer& l, const Tensors& xs, const Env&) {
  static const std::map<std::string, int64_t> modes = {{"bilinear", 0}, {"nearest", 1}, {"bicubic", 2}};
  static const std::map<std::string, int64_t> paddings = {{"zeros", 0}, {"border", 1}, {"reflection", 2}};
  return {at::grid_sampler(xs[0], xs[1], modes.at(l.str("mode")), paddings.at(l.str("padding_mode")),
                           l.flag("align_corners"))};
}

Tensors attention(const Layer& l, const Tensors& xs, const Env&) {
  std::optional<at::Tensor> mask;
  if (xs.size() > 3) mask = xs[3];
  std::optional<double> scale;
  if (l.has("scale")) scale = l.real("scale");
  return {at::scaled_dot_product_attention(xs[0], xs[1], xs[2], mask, 0.0, l.flag("causal"), scale,
                                          l.flag("enable_gqa"))};
}

Tensors dim_value(const Layer& l, const Tensors&, const Env& env) {
  return {
      at::full({}, l.integer("value", env), at::TensorOptions().dtype(dtype_of(l.str("dtype"))).device(env.device))};
}

// ---- control flow: sub-networks run by run_network, with the outer network's symbols -------------------------

// Copies of a control-flow layer's results: a branch or body may give back one of its inputs, a view of one or a
// constant's weight, and no output may share memory with those.
Tensors fresh(Tensors results) {
  for (at::Tensor& r : results) r = r.clone();
  return results;
}

Tensors conditional(const Layer& l, const Tensors& xs, const Env& env) {
  const Network& taken = *l.subnetworks[xs[0].item<bool>() ? 0 : 1];
  return fresh(run_network(taken, Tensors(xs.begin() + 1, xs.end()), env));
}

Tensors loop(const Layer& l, const Tensors& xs, const Env& env) {
  int64_t carried_count = l.param("num_carried").i.value, max_trips = l.param("max_trips").i.value;
  Tensors carried(xs.begin() + 2, xs.begin() + 2 + carried_count), read(xs.begin() + 2 + carried_count, xs.end());
  int64_t trips = xs[0].item<int64_t>();
  bool go = xs[1].item<bool>();
  Tensors ins;
  for (int64_t i = 0; go && i < trips; ++i) {
    if (i == max_trips)
      input_error("loop layer '" + l.name + "': these inputs need more than its " + std::to_string(max_trips) +
                  " iterations");
    ins.assign({at::scalar_tensor(i, at::TensorOptions().dtype(at::kLong).device(env.device))});
    ins.insert(ins.end(), carried.begin(), carried.end());
    ins.insert(ins.end(), read.begin(), read.end());
    Tensors outs = run_network(*l.subnetworks[0], ins, env);
    go = outs[0].item<bool>();
    carried.assign(outs.begin() + 1, outs.end());
  }
  return fresh(std::move(carried));
}

const std::map<std::string, Meaning>& meanings() {
  static const std::map<std::string, Meaning> table = {
      {"constant", constant},
      {"identity", identity},
      {"cast", cast},
      {"convolution", convolution},
      {"scale", scale},
      {"activation", activation},
      {"parametric_relu", prelu},
      {"elementwise", binary},
      {"unary", unary_op},
      {"pooling", pooling},
      {"matrix_multiply", matmul},
      {"shuffle", shuffle},
      {"reduce", reduce},
      {"softmax", softmax},
      {"concatenation", concatenation},
      {"slice", slice},
      {"expand", expand},
      {"gather", gather},
      {"scatter", scatter},
      {"select", select},
      {"topk", topk},
      {"resize", resize},
      {"padding", padding},
      {"normalization", normalization},
      {"einsum", einsum},
      {"cumulative", cumulative},
      {"fill", fill},
      {"shape", shape},
      {"grid_sample", grid_sample},
      {"attention", attention},
      {"dim_value", dim_value},
      {"quantize", quantize},
      {"dequantize", dequantize},
      {"non_zero", non_zero},
      {"unique", unique},
      {"conditional", conditional},
      {"loop", loop},
  };
  return table;
}

}  // namespace

std::vector<size_t> input_gathers(const Network& network) {
  std::vector<size_t> found;
  for (size_t k = 0; k < network.layers.size(); ++k) {
    const Layer& l = network.layers[k];
    if (l.kind == "gather" && l.inputs.size() >= 2 && l.inputs[1] < network.num_inputs) found.push_back(k);
  }
  return found;
}

void check_input_indices(const Network& network, const std::vector<size_t>& gathers,
                         const std::vector<at::Tensor>& inputs, const Env& env) {
  for (size_t k : gathers) {
    const Layer& l = network.layers[k];
    std::vector<int64_t> data;
    for (const Dim& d : network.tensors[l.inputs[0]].shape) data.push_back(d.eval(env.symbols));
    check_gather(l, data, inputs[l.inputs[1]], env);
  }
}

Meaning meaning_of(const std::string& kind) {
  auto it = meanings().find(kind);
  if (it == meanings().end()) format_error("layer kind '" + kind + "' has no meaning in the C++ runtime");
  return it->second;
}

// ---- validate (ir/layers.py) ---------------------------------------------------------------------------

namespace {

bool same_dim(const Dim& a, const Dim& b) {  // the same tree (honest engines write equal dims alike: sympy's form)
  if (a.op != b.op || a.value != b.value || a.args.size() != b.args.size()) return false;
  for (size_t k = 0; k < a.args.size(); ++k)
    if (!same_dim(a.args[k], b.args[k])) return false;
  return true;
}

std::string dim_text(const Dim& d, const std::vector<Symbol>& symbols) {
  static const char* ops[] = {"", "", "add", "mul", "max", "min", "floordiv", "mod"};
  if (d.op == Dim::Op::Int) return std::to_string(d.value);
  if (d.op == Dim::Op::Sym) return symbols[d.value].name;
  std::vector<std::string> args;
  for (const Dim& a : d.args) args.push_back(dim_text(a, symbols));
  return std::string(ops[(int)d.op]) + "(" + c10::Join(", ", args) + ")";
}

struct Check {
  const Layer& l;
  const std::vector<TensorInfo>& tensors;
  const std::vector<Symbol>& symbols;
  const std::string& where;

  [[noreturn]] void fail(const std::string& problem) const {
    format_error(where + ": " + l.kind + " layer '" + l.name + "': " + problem);
  }
  const TensorInfo& in(size_t k) const { return tensors[l.inputs[k]]; }
  int64_t rank(size_t k) const { return in(k).shape.size(); }
  // A dim's least and largest values over the symbols' ranges (each end evaluated: the dims are monotone sums,
  // products and quotients of the symbols in practice).
  std::pair<int64_t, int64_t> bounds(const Dim& d) const {
    if (d.is_int()) return {d.value, d.value};
    std::vector<int64_t> lo, hi;
    for (const Symbol& s : symbols) lo.push_back(s.lo), hi.push_back(s.hi);
    int64_t a = d.eval(lo), b = d.eval(hi);
    return {std::min(a, b), std::max(a, b)};
  }
  void range(const std::string& what, const std::vector<Param>& values, int64_t lo, int64_t hi) const {
    for (size_t i = 0; i < values.size(); ++i) {
      auto [least, most] = bounds(values[i].i);
      if (least < lo || most > hi)
        fail(what + "[" + std::to_string(i) + "] = " + std::to_string(least == most ? least : most) + " is outside [" +
             std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  }
  void axis(const std::string& what, int64_t a, int64_t r) const {
    int64_t n = std::max<int64_t>(r, 1);
    if (!(-n <= a && a < n))
      fail(what + " " + std::to_string(a) + " is out of range for a tensor of rank " + std::to_string(r));
  }
  int64_t dim_at_most(const Dim& d) const { return bounds(d).second; }
  std::string type_text(const TensorInfo& t) const {
    std::vector<std::string> dims;
    for (const Dim& d : t.shape) dims.push_back(dim_text(d, symbols));
    return "torch." + kinds().dtype_name(t.dtype) + "[" + c10::Join(", ", dims) + "]";
  }
  // ir/layers.py's _check_flag and _check_signature (control flow).
  void flag(const std::string& what, const TensorInfo& t, std::vector<at::ScalarType> dtypes) const {
    if (t.shape.empty() && std::find(dtypes.begin(), dtypes.end(), t.dtype) != dtypes.end()) return;
    std::vector<std::string> names;
    for (at::ScalarType d : dtypes) names.push_back(kinds().dtype_name(d));
    fail(what + " must be a 0-d " + c10::Join(", ", names) + " tensor, got " + type_text(t));
  }
  // `tensors` (a sub-network's inputs or outputs) have the count, dtypes and shapes of `expected`.
  void signature(const std::string& what, const std::vector<const TensorInfo*>& tensors,
                 const std::vector<const TensorInfo*>& expected) const {
    if (tensors.size() != expected.size())
      fail(what + ": " + std::to_string(tensors.size()) + " tensors for " + std::to_string(expected.size()));
    for (size_t k = 0; k < tensors.size(); ++k) {
      const TensorInfo &t = *tensors[k], &e = *expected[k];
      bool same = t.dtype == e.dtype && t.shape.size() == e.shape.size();
      for (size_t d = 0; same && d < t.shape.size(); ++d) same = same_dim(t.shape[d], e.shape[d]);
      if (!same) fail(what + " " + std::to_string(k) + " is " + type_text(t) + ", expected " + type_text(e));
    }
  }
  void constant_indices(size_t k, int64_t lo, int64_t hi) const {
    const at::Tensor& value = in(k).constant;
    if (value.defined() && value.numel()) {
      int64_t least = value.min().item<int64_t>(), most = value.max().item<int64_t>();
      if (!(lo <= least && most < hi))
        fail("indices hold values in [" + std::to_string(least) + ", " + std::to_string(most) + "], outside [" +
             std::to_string(lo) + ", " + std::to_string(hi) + ")");
    }
  }
};

std::string dims_text(const std::vector<int64_t>& v) { return "[" + c10::Join(", ", v) + "]"; }

// A network's inputs from `from` on, and its outputs from `from` on.
std::vector<const TensorInfo*> inputs_of(const Network& n, size_t from = 0) {
  std::vector<const TensorInfo*> out;
  for (int i = (int)from; i < n.num_inputs; ++i) out.push_back(&n.tensors[i]);
  return out;
}

std::vector<const TensorInfo*> outputs_of(const Network& n, size_t from = 0) {
  std::vector<const TensorInfo*> out;
  for (size_t k = from; k < n.outputs.size(); ++k) out.push_back(&n.tensors[n.outputs[k]]);
  return out;
}

}  // namespace

void validate_layer(const Layer& l, const std::vector<TensorInfo>& tensors, const std::vector<Symbol>& symbols,
                    const std::string& where) {
  const KindInfo& kind = *kinds().find(l.kind);
  Check c{l, tensors, symbols, where};
  int64_t n = l.inputs.size();
  if (n < kind.min_inputs || (kind.max_inputs >= 0 && n > kind.max_inputs))
    c.fail("got " + std::to_string(n) + " inputs");
  std::vector<std::string> missing, unknown;
  for (const auto& w : kind.required_weights)
    if (!l.weights.count(w)) missing.push_back("'" + w + "'");
  for (const auto& [w, t] : l.weights)
    if (std::find(kind.weights.begin(), kind.weights.end(), w) == kind.weights.end()) unknown.push_back("'" + w + "'");
  if (!missing.empty() || !unknown.empty())
    c.fail("missing weights [" + c10::Join(", ", missing) + "], unknown weights [" + c10::Join(", ", unknown) + "]");
  int64_t max_rank = kinds().bound("MAX_RANK"), extent = kinds().bound("MAX_EXTENT");
  for (const auto& [w, t] : l.weights) {
    if (std::find(kind.weight_dtypes.begin(), kind.weight_dtypes.end(), t.scalar_type()) == kind.weight_dtypes.end())
      c.fail("weight '" + w + "' has dtype " + kinds().dtype_name(t.scalar_type()) + "; this kind takes other dtypes");
    if (t.dim() > max_rank) c.fail("weight '" + w + "' has rank " + std::to_string(t.dim()) + ", over the limit");
  }
  const std::string& k = l.kind;
  auto list = [&](const std::string& key) -> const std::vector<Param>& {
    static const std::vector<Param> none;
    return l.has(key) ? l.param(key).list : none;
  };
  if (k == "convolution") {
    const at::Tensor& kernel = l.weights.at("kernel");
    int64_t nd = kernel.dim() - 2;
    if (nd < 1 || nd > 3)
      c.fail("kernel of rank " + std::to_string(kernel.dim()) + "; a 1-, 2- or 3-d convolution needs rank 3, 4 or 5");
    if (c.rank(0) != nd + 1 && c.rank(0) != nd + 2)
      c.fail("input of rank " + std::to_string(c.rank(0)) + " for a " + std::to_string(nd) + "-d kernel");
    for (auto [what, lo, zero_ok] : {std::tuple<const char*, int64_t, bool>{"stride", 1, false},
                                     {"padding", 0, false},
                                     {"dilation", 1, false},
                                     {"output_padding", 0, true}}) {
      size_t len = list(what).size();
      if (!(len == 1 || len == (size_t)nd || (zero_ok && len == 0)))
        c.fail(std::string(what) + " needs " + std::to_string(nd) + " entries");
      c.range(what, list(what), lo, extent);
    }
    int64_t groups = l.param("groups").i.value;
    bool transposed = l.flag("transposed");
    if (!(1 <= groups && groups <= extent) || (!transposed && kernel.size(0) % groups))
      c.fail("groups " + std::to_string(groups) + " does not divide the " + std::to_string(kernel.size(0)) +
             " kernels");
    int64_t out_channels = transposed ? kernel.size(1) * groups : kernel.size(0);
    const at::Tensor* bias = l.weight("bias");
    if (bias && (bias->dim() != 1 || bias->size(0) != out_channels))
      c.fail("bias of shape " + dims_text(bias->sizes().vec()) + " for " + std::to_string(out_channels) +
             " output channels");
  } else if (k == "scale") {
    const std::string& mode = l.str("mode");
    if (mode == "channel") {
      int64_t a = l.param("channel_axis").i.value;
      c.axis("channel_axis", a, c.rank(0));
      int64_t r = c.rank(0);
      int64_t channels = r ? c.dim_at_most(c.in(0).shape[((a % r) + r) % r]) : 1;
      for (const auto& [w, t] : l.weights)
        if (t.numel() != 1 && t.numel() != channels)
          c.fail("weight '" + w + "' has " + std::to_string(t.numel()) + " values for " + std::to_string(channels) +
                 " channels");
    } else if (mode == "uniform") {
      for (const auto& [w, t] : l.weights)
        if (t.numel() != 1) c.fail("uniform weight '" + w + "' has " + std::to_string(t.numel()) + " values, not one");
    }
  } else if (k == "pooling") {
    size_t nd = list("window").size();
    for (auto [what, lo, lengths] : {std::tuple<const char*, int64_t, std::set<size_t>>{"window", 1, {nd}},
                                     {"stride", 1, {0, 1, nd}},
                                     {"padding", 0, {1, nd}},
                                     {"dilation", 1, {0, 1, nd}}}) {
      if (!lengths.count(list(what).size()))
        c.fail(std::string(what) + " does not fit a " + std::to_string(nd) + "-d window");
      c.range(what, list(what), lo, extent);
    }
    if (l.has("divisor_override")) {
      int64_t d = l.param("divisor_override").i.value;
      if (d < 1 || d > extent)
        c.fail("divisor_override " + std::to_string(d) + " is outside [1, " + std::to_string(extent) + "]");
    }
  } else if (k == "reduce") {
    int64_t r = c.rank(0), m = std::max<int64_t>(r, 1);
    std::set<int64_t> seen;
    for (const Param& a : list("axes")) {
      c.axis("axis", a.i.value, r);
      seen.insert(((a.i.value % m) + m) % m);
    }
    if (seen.size() != list("axes").size()) c.fail("axes repeat an axis");
  } else if (k == "softmax" || k == "concatenation" || k == "cumulative") {
    c.axis("axis", l.param("axis").i.value, c.rank(0));
  } else if (k == "expand") {
    int64_t len = list("shape").size();
    if (!(c.rank(0) <= len && len <= max_rank))
      c.fail("shape has fewer dims than the input or more than " + std::to_string(max_rank));
    c.range("shape", list("shape"), -1, int64_t(1) << 62);
  } else if (k == "gather") {
    const std::string& mode = l.str("mode");
    at::ScalarType it = c.in(1).dtype;
    if (!(it == at::kLong || (mode != "element" && it == at::kInt)))
      c.fail(mode + " gather indices of dtype " + kinds().dtype_name(it));
    if (mode == "nd") {
      const Shape& is = c.in(1).shape;
      int64_t depth = is.empty() ? 0 : c.dim_at_most(is.back());
      if (!(1 <= depth && depth <= c.rank(0))) c.fail("nd indices for data of rank " + std::to_string(c.rank(0)));
      const at::Tensor& value = c.in(1).constant;
      if (value.defined() && value.numel()) {
        at::Tensor columns = value.reshape({-1, depth});
        for (int64_t d = 0; d < depth; ++d) {
          int64_t lo = columns.select(1, d).min().item<int64_t>(), hi = columns.select(1, d).max().item<int64_t>();
          int64_t size = c.dim_at_most(c.in(0).shape[d]);
          if (!(0 <= lo && hi < size))
            c.fail("indices for dim " + std::to_string(d) + " hold values in [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "], outside [0, " + std::to_string(size) + ")");
        }
      }
    } else {
      int64_t a = l.param("axis").i.value, r = c.rank(0);
      c.axis("axis", a, r);
      int64_t size = r ? c.dim_at_most(c.in(0).shape[((a % r) + r) % r]) : 1;
      c.constant_indices(1, 0, size);
    }
  } else if (k == "scatter") {
    int64_t a = l.param("axis").i.value, r = c.rank(0);
    c.axis("axis", a, r);
    if (c.in(1).dtype != at::kLong) c.fail("indices must be int64, got " + kinds().dtype_name(c.in(1).dtype));
    c.constant_indices(1, 0, r ? c.dim_at_most(c.in(0).shape[((a % r) + r) % r]) : 1);
  } else if (k == "topk") {
    int64_t a = l.param("axis").i.value, r = c.rank(0);
    c.axis("axis", a, r);
    int64_t size = r ? c.bounds(c.in(0).shape[((a % r) + r) % r]).first : 1;
    auto [klo, khi] = c.bounds(l.param("k").i);
    if (!(0 <= klo && khi <= size))
      c.fail("k " + std::to_string(khi) + " is outside [0, " + std::to_string(size) + "] on axis " + std::to_string(a));
  } else if (k == "resize") {
    static const std::set<std::string> modes = {"nearest", "nearest-exact", "linear", "bilinear",
                                                "bicubic", "trilinear",     "area"};
    if (!modes.count(l.str("mode"))) c.fail("unknown mode '" + l.str("mode") + "'");
    if (l.has("size")) c.range("size", list("size"), 1, int64_t(1) << 40);
    const auto& scales = list("scales");
    for (size_t i = 0; i < scales.size(); ++i)
      if (!(std::isfinite(scales[i].f) && scales[i].f > 0 && scales[i].f <= extent))
        c.fail("scales[" + std::to_string(i) + "] is not a positive finite factor");
  } else if (k == "padding") {
    size_t len = list("pad").size();
    if (len % 2 || (int64_t)len > 2 * c.rank(0))
      c.fail("pad needs a (begin, end) pair for each of at most " + std::to_string(c.rank(0)) + " dims");
    c.range("pad", list("pad"), -extent, extent);
  } else if (k == "normalization") {
    double eps = l.real("epsilon");
    if (!(std::isfinite(eps) && eps >= 0)) c.fail("epsilon is not a non-negative number");
    std::vector<int64_t> expected;
    const std::string& kind_name = l.str("kind");
    if (kind_name == "layer") {
      for (const Param& p : list("normalized_shape")) expected.push_back(p.i.value);
    } else {
      if (c.rank(0) < 2)
        c.fail(kind_name + " normalization needs an input of rank 2 or more, got " + std::to_string(c.rank(0)));
      int64_t channels = c.dim_at_most(c.in(0).shape[1]);
      expected = {channels};
      int64_t groups = l.param("num_groups").i.value;
      if (kind_name == "group" && !(groups >= 1 && channels % groups == 0))
        c.fail("num_groups " + std::to_string(groups) + " does not divide the " + std::to_string(channels) +
               " channels");
    }
    for (const auto& [w, t] : l.weights)
      if (t.sizes().vec() != expected)
        c.fail("weight '" + w + "' of shape " + dims_text(t.sizes().vec()) + ", expected " + dims_text(expected));
  } else if (k == "einsum") {
    if (l.str("equation").size() > 1024)
      c.fail("equation of " + std::to_string(l.str("equation").size()) + " characters");
  } else if (k == "fill") {
    if (c.bounds(l.param("length").i).first < 0) c.fail("negative length");
  } else if (k == "select") {  // torch.where refuses another condition (Python's meta kernel at load)
    if (c.in(0).dtype != at::kBool)
      c.fail("rejects inputs: where expected condition to be a boolean tensor, but got a tensor with dtype " +
             kinds().dtype_name(c.in(0).dtype));
  } else if (k == "quantize" || k == "dequantize") {  // _QuantizeBase.validate and the kinds'
    at::ScalarType type = dtype_of(l.str("quant_type"));
    if (type != at::kChar && type != at::kFloat8_e4m3fn)
      c.fail("quant_type " + l.str("quant_type") + " is not one of int8, float8_e4m3fn");
    const at::Tensor& scale = l.weights.at("scale");
    if (scale.scalar_type() != at::kFloat || scale.dim() > 1 || !(scale > 0).all().item<bool>() ||
        !at::isfinite(scale).all().item<bool>())
      c.fail("scale must be finite positive float32 values in at most one dim");
    int64_t count = 1;  // a symbolic channel count is checked when it runs
    if (l.has("axis")) {
      int64_t a = l.param("axis").i.value, r = c.rank(0);
      c.axis("axis", a, r);
      const Dim& d = c.in(0).shape[((a % r) + r) % r];
      count = d.is_int() ? d.value : scale.numel();
    }
    if (scale.numel() != count)
      c.fail("scale has " + std::to_string(scale.numel()) + " values for " + std::to_string(count) + " channels");
    if (const at::Tensor* zero = l.weight("zero_point"))
      if (type != at::kChar || zero->scalar_type() != at::kChar || zero->sizes() != scale.sizes())
        c.fail("zero_point must be int8 with the scale's shape, and only for int8");
    if (k == "quantize") {
      int64_t lo = l.param("quant_min").i.value, hi = l.param("quant_max").i.value;
      if (!(-128 <= lo && lo <= hi && hi <= 127))
        c.fail("[quant_min, quant_max] = [" + std::to_string(lo) + ", " + std::to_string(hi) +
               "] is not a range of int8");
      if (!at::isFloatingType(c.in(0).dtype)) c.fail("quantize takes a float tensor");
    } else if (c.in(0).dtype != type || !at::isFloatingType(dtype_of(l.str("to_type")))) {
      c.fail("dequantizes " + kinds().dtype_name(c.in(0).dtype) + " to " + l.str("to_type") + "; it takes " +
             l.str("quant_type") + " to a float");
    }
  } else if (k == "non_zero" || k == "unique") {  // _DataDependentBase.validate
    const Dim& count = l.param("count").i;
    int64_t most = 1;
    for (const Dim& d : c.in(0).shape) most *= c.dim_at_most(d);
    if (count.op != Dim::Op::Sym || symbols[count.value].lo != 0 || symbols[count.value].hi != most)
      c.fail("count must be a symbol of its own in [0, " + std::to_string(most) + "] (the input's element count)");
  } else if (k == "conditional") {
    std::vector<const TensorInfo*> operands;
    for (size_t i = 1; i < l.inputs.size(); ++i) operands.push_back(&c.in(i));
    c.flag("the predicate", c.in(0), {at::kBool});
    for (const auto& branch : l.subnetworks) c.signature(branch->name + " input", inputs_of(*branch), operands);
    const Network &then = *l.subnetworks[0], &otherwise = *l.subnetworks[1];
    if (then.outputs.empty()) c.fail("a branch gives no outputs");
    c.signature("else_branch output", outputs_of(otherwise), outputs_of(then));
  } else if (k == "loop") {
    const Dim &carried = l.param("num_carried").i, &trips = l.param("max_trips").i;
    if (!carried.is_int() || !trips.is_int()) c.fail("num_carried and max_trips must be ints");
    if (!(1 <= carried.value && carried.value <= n - 2))
      c.fail("num_carried " + std::to_string(carried.value) + " is outside [1, " + std::to_string(n - 2) + "]");
    if (!(0 <= trips.value && trips.value <= kinds().bound("MAX_LOOP_TRIPS")))
      c.fail("max_trips " + std::to_string(trips.value) + " is outside [0, " +
             std::to_string(kinds().bound("MAX_LOOP_TRIPS")) + "]");
    c.flag("the trip count", c.in(0), {at::kLong, at::kInt});
    c.flag("the condition", c.in(1), {at::kBool});
    const Network& body = *l.subnetworks[0];
    if (body.num_inputs == 0) c.fail("the body takes no iteration input");
    c.flag("the body's iteration input", body.tensors[0], {at::kLong});
    std::vector<const TensorInfo*> values, carried_values;
    for (int64_t i = 2; i < n; ++i) values.push_back(&c.in(i));
    carried_values.assign(values.begin(), values.begin() + carried.value);
    c.signature("body input", inputs_of(body, 1), values);
    if (body.outputs.empty()) c.fail("the body gives no condition");
    c.flag("the body's condition output", body.tensors[body.outputs[0]], {at::kBool});
    c.signature("body carried output", outputs_of(body, 1), carried_values);
  } else if (k == "grid_sample") {
    const std::string &m = l.str("mode"), &p = l.str("padding_mode");
    if ((m != "bilinear" && m != "nearest" && m != "bicubic") || (p != "zeros" && p != "border" && p != "reflection"))
      c.fail("unknown mode '" + m + "' or padding_mode '" + p + "'");
  }
}

}  // namespace torchkiln
