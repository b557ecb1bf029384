// Engine bytes -> Engine: the header, the section table, the SHA-256, the JSON sections, the safetensors weights,
// and every layer checked as runtime/serialization.py checks it (same bounds, same EngineFormatError texts where
// the check is the same; csrc/layer_kinds.json is the Python layer registry's description).
#include <c10/core/CPUAllocator.h>
#include <dlfcn.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

#include "budget.h"
#include "json.h"
#include "kinds.h"
#include "tape.h"
#include "torchkiln/engine.h"

namespace torchkiln {
namespace {

constexpr char kMagic[8] = {'T', 'K', 'L', 'N', 'E', 'N', 'G', '\0'};
constexpr size_t kPrefixV1 = 8 + 4 + 4 + 8 + 8;
constexpr size_t kHeader = 8 + 4 + 4;
constexpr size_t kSection = 16 + 8;
constexpr size_t kDigest = 32;

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86 and arm64 are little-endian, as the format
  return v;
}

using Sections = std::map<std::string, std::pair<const uint8_t*, size_t>>;

void check_digest(const uint8_t* data, size_t size) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(data, size - kDigest, digest);
  if (std::memcmp(digest, data + size - kDigest, kDigest) != 0)
    format_error("engine data is corrupted: checksum mismatch");
}

Sections sections_v1(const uint8_t* data, size_t size) {
  uint64_t graph_len = read_le<uint64_t>(data + 16), weights_len = read_le<uint64_t>(data + 24);
  unsigned __int128 expected = (unsigned __int128)kPrefixV1 + graph_len + weights_len + kDigest;
  if (expected != size)
    format_error("engine data is truncated or padded: header declares " + std::to_string((uint64_t)expected) +
                 " bytes, got " + std::to_string(size));
  check_digest(data, size);
  return {{"graph", {data + kPrefixV1, graph_len}}, {"weights", {data + kPrefixV1 + graph_len, weights_len}}};
}

// "plan.K" or "tape.K" (`prefix`, five characters), K of one to three digits.
bool is_numbered(const std::string& name, const char* prefix) {
  if (name.rfind(prefix, 0) != 0 || name.size() > 8 || name.size() == 5) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Sections sections_v2(const uint8_t* data, size_t size) {
  uint32_t count = read_le<uint32_t>(data + 12);
  if (count > kinds().bound("MAX_SECTIONS"))
    format_error("engine declares " + std::to_string(count) + " sections (at most " +
                 std::to_string(kinds().bound("MAX_SECTIONS")) + ")");
  size_t start = kHeader + count * kSection;
  if (start + kDigest > size) format_error("engine data is truncated: its section table runs past the end");
  unsigned __int128 expected = start + kDigest;
  std::vector<std::pair<std::string, uint64_t>> table;
  for (uint32_t k = 0; k < count; ++k) {
    const uint8_t* entry = data + kHeader + k * kSection;
    std::string name(reinterpret_cast<const char*>(entry), 16);
    name.erase(name.find_last_not_of('\0') + 1);
    uint64_t n = read_le<uint64_t>(entry + 16);
    table.emplace_back(name, n);
    expected += n;
  }
  if (expected != size)
    format_error("engine data is truncated or padded: its sections declare " + std::to_string((uint64_t)expected) +
                 " bytes, got " + std::to_string(size));
  check_digest(data, size);
  Sections sections;
  for (auto& [raw, n] : table) {
    std::string name;
    for (char c : raw) name += (static_cast<unsigned char>(c) < 128) ? c : '?';
    bool known = name == "meta" || name == "graph" || name == "weights" || is_numbered(name, "plan.") ||
                 is_numbered(name, "tape.");
    if (!known || sections.count(name))
      format_error("engine section '" + name + "' is " + (known ? "repeated" : "unknown"));
    sections[name] = {data + start, n};
    start += n;
  }
  for (const char* name : {"meta", "graph"})
    if (!sections.count(name)) format_error(std::string("engine has no '") + name + "' section");
  return sections;
}

// ---- safetensors ---------------------------------------------------------------------------------------

const std::map<std::string, at::ScalarType>& safetensors_dtypes() {
  static const std::map<std::string, at::ScalarType> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
      {"F8_E4M3", at::kFloat8_e4m3fn}};
  return table;
}

[[noreturn]] void bad_weights(const std::string& why) {
  format_error("engine weights are not valid safetensors: " + why);
}

std::map<std::string, at::Tensor> read_safetensors(const uint8_t* data, size_t size) {
  std::map<std::string, at::Tensor> out;
  if (size == 0) return out;
  if (size < 8) bad_weights("HeaderTooSmall");
  uint64_t n = read_le<uint64_t>(data);
  if (n > 100000000 || n > size - 8) bad_weights("InvalidHeaderLength");
  Json header;
  try {
    header = parse_json(reinterpret_cast<const char*>(data + 8), n, "header");
  } catch (const c10::Error& e) {
    std::string text = e.what_without_backtrace();
    bad_weights(text.substr(text.find(": ") + 2));
  }
  if (header.type != Json::Type::Object) bad_weights("InvalidHeaderDeserialization");
  const uint8_t* body = data + 8 + n;
  uint64_t body_size = size - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [key, entry] : header.object) {
    if (key == "__metadata__") continue;
    const Json *dtype = entry.get("dtype"), *shape = entry.get("shape"), *offsets = entry.get("data_offsets");
    if (!dtype || dtype->type != Json::Type::String || !shape || shape->type != Json::Type::Array || !offsets ||
        offsets->type != Json::Type::Array || offsets->array.size() != 2)
      bad_weights("InvalidHeaderDeserialization");
    auto found = safetensors_dtypes().find(dtype->s);
    if (found == safetensors_dtypes().end()) bad_weights("unsupported dtype " + dtype->s);
    std::vector<int64_t> dims;
    unsigned __int128 elements = 1;
    for (const Json& d : shape->array) {
      if (!d.is_int() || d.i < 0) bad_weights("InvalidHeaderDeserialization");
      dims.push_back(d.i);
      elements *= (uint64_t)d.i;
      if (elements > ((unsigned __int128)1 << 64)) bad_weights("ValidationOverflow");
    }
    for (const Json& o : offsets->array)
      if (!o.is_int() || o.i < 0) bad_weights("InvalidHeaderDeserialization");
    uint64_t begin = offsets->array[0].i, end = offsets->array[1].i;
    if (begin > end || end > body_size) bad_weights("InvalidOffset(" + key + ")");
    if (elements * at::elementSize(found->second) != end - begin) bad_weights("TensorInvalidInfo");
    spans.emplace_back(begin, end);
    at::Tensor t = at::empty(dims, at::TensorOptions().dtype(found->second));
    if (end > begin) std::memcpy(t.data_ptr(), body + begin, end - begin);
    out[key] = t;
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at_byte = 0;
  for (auto [b, e] : spans) {
    if (b != at_byte) bad_weights("InvalidOffset");
    at_byte = e;
  }
  if (at_byte != body_size) bad_weights("MetadataIncompleteBuffer");
  return out;
}

// ---- fields -------------------------------------------------------------------------------------------

std::string q(const std::string& s) { return "'" + s + "'"; }

const Json& field(const Json* obj, const std::string& key, Json::Type type, const std::string& where) {
  const Json* v = obj ? obj->get(key) : nullptr;
  if (!v || v->type != type) format_error(where + ": missing or malformed field " + q(key));
  return *v;
}

const std::vector<Json>& list_field(const Json* obj, const std::string& key, const std::string& where, size_t limit) {
  const Json& v = field(obj, key, Json::Type::Array, where);
  if (v.array.size() > limit)
    format_error(where + ": " + q(key) + " holds " + std::to_string(v.array.size()) + " entries, over the limit of " +
                 std::to_string(limit));
  return v.array;
}

at::ScalarType parse_dtype(const Json* raw, const std::string& where) {
  if (!raw || raw->type != Json::Type::String || !kinds().dtypes.count(raw->s))
    format_error(where + ": " + (raw ? raw->repr() : "None") + " is not a dtype");
  return kinds().dtypes.at(raw->s);
}

std::vector<int64_t> parse_shape(const Json* raw, const std::string& where) {
  bool ok = raw && raw->type == Json::Type::Array && raw->array.size() <= kinds().bound("MAX_RANK");
  std::vector<int64_t> out;
  if (ok)
    for (const Json& d : raw->array) {
      if (!d.is_int() || d.i < 0 || d.i >= (int64_t(1) << 40)) {
        ok = false;
        break;
      }
      out.push_back(d.i);
    }
  if (!ok) format_error(where + ": " + (raw ? raw->repr() : "None") + " is not a shape");
  return out;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::vector<Symbol> parse_symbols(const Json* raw) {
  std::vector<Symbol> out;
  if (!raw) return out;
  int64_t limit = kinds().bound("MAX_SYMBOLS");
  if (raw->type != Json::Type::Array || (int64_t)raw->array.size() > limit)
    format_error("network symbols: expected a list of at most " + std::to_string(limit));
  for (size_t i = 0; i < raw->array.size(); ++i) {
    const Json& entry = raw->array[i];
    std::string where = "network symbol " + std::to_string(i);
    const std::string& name = field(&entry, "name", Json::Type::String, where).s;
    const Json& lo = field(&entry, "min", Json::Type::Int, where);
    const Json& hi = field(&entry, "max", Json::Type::Int, where);
    bool repeated = std::any_of(out.begin(), out.end(), [&](const Symbol& s) { return s.name == name; });
    if (repeated || !is_identifier(name) || name.size() > 64 || entry.object.size() != 3 || lo.i < 0 || lo.i > hi.i ||
        hi.i >= (int64_t(1) << 40))
      format_error(where + ": malformed " + entry.repr(80));
    out.push_back({name, lo.i, hi.i});
  }
  return out;
}

// A symbolic dim's tree (ir/symbolic.py's from_tree): bounded depth and size, known ops and symbols.
Dim dim_from_tree(const Json& t, const std::vector<Symbol>& symbols, int depth, int& count) {
  if (++count > kinds().bound("MAX_TREE_NODES") || depth > kinds().bound("MAX_TREE_DEPTH"))
    throw std::invalid_argument("symbolic dim tree is too deep or too large");
  Dim d;
  if (t.type == Json::Type::Int || t.type == Json::Type::BigInt) {
    if (t.type == Json::Type::BigInt || t.i >= (int64_t(1) << 62) || t.i <= -(int64_t(1) << 62))
      throw std::invalid_argument("integer out of range in a symbolic dim");
    d.value = t.i;
    return d;
  }
  const Json* op = t.get("op");
  if (!op || op->type != Json::Type::String) throw std::invalid_argument("malformed symbolic dim node " + t.repr(80));
  if (op->s == "sym") {
    const Json* name = t.get("name");
    auto it = name && name->type == Json::Type::String
                  ? std::find_if(symbols.begin(), symbols.end(), [&](const Symbol& s) { return s.name == name->s; })
                  : symbols.end();
    if (t.object.size() != 2 || it == symbols.end())
      throw std::invalid_argument("unknown symbol in symbolic dim node " + t.repr(80));
    d.op = Dim::Op::Sym;
    d.value = it - symbols.begin();
    return d;
  }
  static const std::map<std::string, Dim::Op> ops = {{"add", Dim::Op::Add},           {"mul", Dim::Op::Mul},
                                                     {"max", Dim::Op::Max},           {"min", Dim::Op::Min},
                                                     {"floordiv", Dim::Op::FloorDiv}, {"mod", Dim::Op::Mod}};
  const Json* args = t.get("args");
  auto found = ops.find(op->s);
  if (found == ops.end() || t.object.size() != 2 || !args || args->type != Json::Type::Array || args->array.empty() ||
      args->array.size() > 64)
    throw std::invalid_argument("malformed symbolic dim node " + t.repr(80));
  d.op = found->second;
  for (const Json& a : args->array) d.args.push_back(dim_from_tree(a, symbols, depth + 1, count));
  if ((d.op == Dim::Op::Max || d.op == Dim::Op::Min) && (int64_t)d.args.size() > kinds().bound("MAX_EXTREMUM_ARGS"))
    throw std::invalid_argument("a " + op->s + " of " + std::to_string(d.args.size()) + " arguments (at most " +
                                std::to_string(kinds().bound("MAX_EXTREMUM_ARGS")) + ")");
  if ((d.op == Dim::Op::FloorDiv || d.op == Dim::Op::Mod) && d.args.size() != 2)
    throw std::invalid_argument(op->s + " takes 2 arguments, got " + std::to_string(d.args.size()));
  return d;
}

Dim parse_dim(const Json& raw, const std::vector<Symbol>& symbols, const std::string& where) {
  if (raw.type == Json::Type::Object) {
    int count = 0;
    try {
      Dim d = dim_from_tree(raw, symbols, 0, count);
      std::vector<int64_t> lo(symbols.size()), hi(symbols.size());
      for (size_t k = 0; k < symbols.size(); ++k) lo[k] = symbols[k].lo, hi[k] = symbols[k].hi;
      d.eval(lo);  // refuses a tree whose values overflow (or divide by zero) at either end of the ranges
      d.eval(hi);
      return d;
    } catch (const std::invalid_argument& e) {
      format_error(where + ": " + e.what());
    }
  }
  Json one;
  one.type = Json::Type::Array;
  one.array.push_back(raw);
  Dim d;
  d.value = parse_shape(&one, where)[0];
  return d;
}

Shape parse_dims(const Json* raw, const std::string& where, const std::vector<Symbol>& symbols) {
  if (!raw || raw->type != Json::Type::Array || raw->array.size() > kinds().bound("MAX_RANK"))
    format_error(where + ": " + (raw ? raw->repr(80) : "None") + " is not a shape");
  Shape out;
  for (const Json& d : raw->array) out.push_back(parse_dim(d, symbols, where));
  return out;
}

// A parameter against its declared type (serialization._decode).
Param decode(const std::string& type, const Json& raw, const std::string& where, const std::vector<Symbol>& symbols) {
  Param p;
  auto refuse = [&](const std::string& name) -> Param {
    format_error(where + ": " + raw.repr() + " is not a valid " + name);
  };
  if (type.rfind("optional[", 0) == 0) {
    if (raw.type == Json::Type::Null) return p;
    return decode(type.substr(9, type.size() - 10), raw, where, symbols);
  }
  if (type.rfind("tuple[", 0) == 0) {
    if (raw.type != Json::Type::Array) format_error(where + ": expected a list, got " + raw.repr(20));
    if (raw.array.size() > kinds().bound("MAX_LIST"))
      format_error(where + ": a list of " + std::to_string(raw.array.size()) + " entries exceeds the limit of " +
                   std::to_string(kinds().bound("MAX_LIST")));
    p.kind = Param::Kind::List;
    std::string inner = type.substr(6, type.size() - 7);
    for (const Json& v : raw.array) p.list.push_back(decode(inner, v, where, symbols));
    return p;
  }
  if (type == "bool") {
    if (raw.type != Json::Type::Bool) return refuse("bool");
    p.kind = Param::Kind::Bool;
    p.b = raw.b;
  } else if (type == "int") {
    p.kind = Param::Kind::Int;
    if (raw.type == Json::Type::Int) {
      p.i.value = raw.i;
    } else if (raw.type == Json::Type::Object && !symbols.empty()) {
      p.i = parse_dim(raw, symbols, where);
    } else {
      return refuse("int");
    }
  } else if (type == "float") {
    if (!raw.is_number()) return refuse("float");
    p.kind = Param::Kind::Float;
    p.f = raw.type == Json::Type::Float ? raw.f : (double)raw.i;
  } else if (type == "str") {
    if (raw.type != Json::Type::String || raw.s.size() > kinds().bound("MAX_STRING")) return refuse("str");
    p.kind = Param::Kind::Str;
    p.s = raw.s;
  } else if (type == "dtype") {
    if (raw.type != Json::Type::String || !kinds().dtypes.count(raw.s)) return refuse("dtype");
    p.kind = Param::Kind::Str;
    p.s = raw.s;
  } else {
    const auto& values = kinds().enums.at(type);
    if (raw.type != Json::Type::String || std::find(values.begin(), values.end(), raw.s) == values.end())
      return refuse(type);
    p.kind = Param::Kind::Str;
    p.s = raw.s;
  }
  return p;
}

std::string dtype_text(at::ScalarType t) { return kinds().dtype_name(t); }

std::string shape_text(const Shape& shape, const std::vector<int64_t>& at_values) {
  std::string out = "[";
  for (size_t k = 0; k < shape.size(); ++k)
    out += (k ? ", " : "") + (shape[k].is_int() ? std::to_string(shape[k].value)
                                                : "<" + std::to_string(shape[k].eval(at_values)) + " here>");
  return out + "]";
}

// Layers whose output may share memory with their input (runtime/executor.py's _MAY_ALIAS).
bool may_alias(const std::string& kind) {
  return kind == "identity" || kind == "shuffle" || kind == "slice" || kind == "expand" || kind == "cast" ||
         kind == "constant";
}

// ---- shape inference ---------------------------------------------------------------------------------------

// Allocations of this thread are counted against it while set: a layer computed at load (below) stays under the
// memory ceiling even where its engine declares smaller outputs than it computes.
thread_local double* probe_allowance = nullptr;

class CappedAllocator final : public c10::Allocator {
 public:
  explicit CappedAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    if (probe_allowance) {
      if ((double)n > *probe_allowance)
        format_error("computed at load to check its output shapes, the layer would allocate more than the " +
                     std::to_string((int64_t)*probe_allowance) + " bytes left under the memory ceiling");
      *probe_allowance -= (double)n;
    }
    return base_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

 private:
  c10::Allocator* base_;
};

void install_capped_allocator() {
  static std::once_flag once;
  std::call_once(once, [] { c10::SetCPUAllocator(new CappedAllocator(c10::GetCPUAllocator()), 1); });
}

// This thread's OpenMP team size set to one while a layer is computed at load (for shapes, on tiny or zero-stride
// inputs), and restored after: ATen then runs the layer inline, without waking a team of threads per layer, which on
// a busy machine costs milliseconds per layer. The OpenMP functions are torch's own (found in the process, not
// linked here); where torch has none, nothing changes.
class OneThread {
 public:
  OneThread() {
    static auto set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    static auto get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    if (set && get) {
      set_ = set;
      before_ = get();
      set_(1);
    }
  }
  ~OneThread() {
    if (set_) set_(before_);
  }

 private:
  void (*set_)(int) = nullptr;
  int before_ = 1;
};

bool pointwise(const std::string& kind) {
  return kind == "elementwise" || kind == "unary" || kind == "activation" || kind == "select" || kind == "cast" ||
         kind == "identity";
}

// A layer's outputs at every symbol's largest value. The meaning runs on meta tensors (nothing is allocated), as
// Python's shape inference does. Where an op has no meta kernel in C++ (Python registers many of them in Python),
// a pointwise layer's shape is its inputs' broadcast and its dtype what the meaning gives on one-element tensors;
// another layer is computed on the CPU on zero-valued inputs of no memory (zero strides), its allocations capped by
// what the memory ceiling leaves.
std::vector<at::Tensor> infer_outputs(const Layer& layer, const std::vector<TensorInfo>& tensors,
                                      const std::vector<int64_t>& highest, double max_memory,
                                      const std::string& where) {
  std::vector<std::vector<int64_t>> dims;
  for (int s : layer.inputs) {
    dims.emplace_back();
    for (const Dim& d : tensors[s].shape) dims.back().push_back(d.eval(highest));
  }
  auto dtype = [&](size_t k) { return tensors[layer.inputs[k]].dtype; };
  OneThread one_thread;
  try {
    try {
      std::vector<at::Tensor> xs;
      for (size_t k = 0; k < dims.size(); ++k)
        xs.push_back(at::empty(dims[k], at::TensorOptions().dtype(dtype(k)).device(at::kMeta)));
      Layer probe = layer;
      if (layer.kind != "constant")  // a constant's value is its output
        for (auto& [k, w] : probe.weights) w = at::empty(w.sizes(), w.options().device(at::kMeta));
      return layer.meaning(probe, xs, Env{highest, at::Device(at::kMeta), true});
    } catch (const c10::NotImplementedError&) {
    }
    std::vector<at::Tensor> xs;
    if (pointwise(layer.kind)) {
      for (size_t k = 0; k < dims.size(); ++k)
        xs.push_back(at::ones(std::vector<int64_t>(dims[k].size(), 1), at::TensorOptions().dtype(dtype(k))));
      std::vector<at::Tensor> small = layer.meaning(layer, xs, Env{highest, at::Device(at::kCPU), true});
      at::DimVector shape(dims[0].begin(), dims[0].end());
      for (size_t k = 1; k < dims.size(); ++k) shape = at::infer_size_dimvector(shape, dims[k]);
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : small)
        out.push_back(at::empty(shape, at::TensorOptions().dtype(t.scalar_type()).device(at::kMeta)));
      return out;
    }
    install_capped_allocator();
    for (size_t k = 0; k < dims.size(); ++k)
      xs.push_back(at::zeros({}, at::TensorOptions().dtype(dtype(k))).expand(dims[k]));
    double allowance = max_memory;
    probe_allowance = &allowance;
    std::vector<at::Tensor> out;
    try {
      out = layer.meaning(layer, xs, Env{highest, at::Device(at::kCPU), true});
    } catch (...) {
      probe_allowance = nullptr;
      throw;
    }
    probe_allowance = nullptr;
    return out;
  } catch (const c10::Error& e) {
    std::string text = e.what_without_backtrace();
    if (text.rfind("EngineFormatError: ", 0) == 0) format_error(where + ": " + text.substr(19));
    format_error(where + ": " + layer.kind + " layer '" + layer.name +
                 "' rejects its inputs: " + text.substr(0, text.find('\n')));
  }
}

// Meta tensors of `results`' dtypes and shapes at every symbol's largest value (a control-flow layer's outputs are
// what its sub-networks give: their own layers were inferred).
std::vector<at::Tensor> on_meta(const std::vector<const TensorInfo*>& results, const std::vector<int64_t>& highest) {
  std::vector<at::Tensor> out;
  for (const TensorInfo* t : results) {
    std::vector<int64_t> dims;
    for (const Dim& d : t->shape) dims.push_back(d.eval(highest));
    out.push_back(at::empty(dims, at::TensorOptions().dtype(t->dtype).device(at::kMeta)));
  }
  return out;
}

}  // namespace

// ---- the network ---------------------------------------------------------------------------------------

namespace {

void symbols_in(const Dim& d, std::set<int64_t>& out) {
  if (d.op == Dim::Op::Sym) out.insert(d.value);
  for (const Dim& a : d.args) symbols_in(a, out);
}

void symbols_in(const Param& p, std::set<int64_t>& out) {
  if (p.kind == Param::Kind::Int) symbols_in(p.i, out);
  for (const Param& q : p.list) symbols_in(q, out);
}

// serialization.py's _check_defined: every symbol a layer's parameters and outputs use is an input dim or the size
// an earlier data-dependent layer defines; a layer defines its own once. (The outputs' dims of a layer without
// sub-networks are its parameters' and inputs'; a conditional's are its then-branch's outputs'.)
void check_defined(const Layer& layer, const std::vector<const TensorInfo*>& results, std::vector<bool>& known,
                   const std::vector<Symbol>& symbols, const std::string& where) {
  if (layer.kind == "non_zero" || layer.kind == "unique") {
    int64_t own = layer.param("count").i.value;
    if (known[own])
      format_error(where + ": symbol " + symbols[own].name + " is defined twice (by an input dim or a layer)");
    known[own] = true;
  }
  std::set<int64_t> used;
  for (const auto& [k, p] : layer.params) symbols_in(p, used);
  for (const TensorInfo* t : results)
    for (const Dim& d : t->shape) symbols_in(d, used);
  std::vector<std::string> unknown;
  for (int64_t s : used)
    if (!known[s]) unknown.push_back("'" + symbols[s].name + "'");
  if (!unknown.empty())
    format_error(where + ": uses symbols [" + c10::Join(", ", unknown) +
                 "] that no input dim or earlier layer defines");
}

// A control-flow layer's result types (ir/layers.py's result_types): its then-branch's outputs, or a loop's
// carried inputs; none for another layer.
std::vector<const TensorInfo*> result_types(const Layer& layer, const std::vector<TensorInfo>& tensors) {
  std::vector<const TensorInfo*> out;
  if (layer.kind == "conditional") {
    const Network& then = *layer.subnetworks[0];
    for (int s : then.outputs) out.push_back(&then.tensors[s]);
  } else if (layer.kind == "loop") {
    int64_t carried = layer.param("num_carried").i.value;
    for (int64_t k = 0; k < carried; ++k) out.push_back(&tensors[layer.inputs[2 + k]]);
  }
  return out;
}

void decode_graph(Network& network, const Json& raw, const std::map<std::string, at::Tensor>& weights,
                  double max_memory, double max_flops, const std::vector<Symbol>& symbols, int depth, size_t& count);

// serialization.py's _decode_subnetworks: a control-flow layer's sub-networks, each read as a network is, with the
// outer network's symbols, at most MAX_NESTING deep.
void decode_subnetworks(Layer& layer, const KindInfo& kind, const Json& entry, const std::string& where,
                        const std::map<std::string, at::Tensor>& weights, double max_memory, double max_flops,
                        const std::vector<Symbol>& symbols, int depth, size_t& count) {
  const Json* raw = entry.get("subnetworks");
  if (raw && raw->type == Json::Type::Null) raw = nullptr;
  if (kind.subnetworks.empty()) {
    if (raw) format_error(where + ": a " + layer.kind + " layer holds no sub-networks");
    return;
  }
  if (depth >= kinds().bound("MAX_NESTING"))
    format_error(where + ": sub-networks nested more than " + std::to_string(kinds().bound("MAX_NESTING")) + " deep");
  bool fits = raw && raw->type == Json::Type::Object && raw->object.size() == kind.subnetworks.size();
  for (const std::string& f : kind.subnetworks) fits = fits && raw->get(f) && raw->get(f)->type == Json::Type::Object;
  if (!fits) {
    std::vector<std::string> names;
    for (const std::string& f : kind.subnetworks) names.push_back(q(f));
    format_error(where + ": expected the sub-networks [" + c10::Join(", ", names) + "]");
  }
  for (const std::string& f : kind.subnetworks) {
    auto sub = std::make_shared<Network>();
    decode_graph(*sub, *raw->get(f), weights, max_memory, max_flops, symbols, depth + 1, count);
    layer.subnetworks.push_back(std::move(sub));
  }
}

// serialization.py's _decode_network: a network (depth 0) or a control-flow layer's sub-network; `count` holds the
// layers read so far at any depth, bounded by MAX_LAYERS together.
void decode_graph(Network& network, const Json& raw, const std::map<std::string, at::Tensor>& weights,
                  double max_memory, double max_flops, const std::vector<Symbol>& symbols, int depth, size_t& count) {
  network.name = field(&raw, "name", Json::Type::String, "network").s;
  network.what = (depth ? "sub-network " : "engine ") + q(network.name);
  std::vector<int64_t> highest;
  for (const Symbol& s : symbols) highest.push_back(s.hi);
  std::map<std::string, int> slots;
  auto define = [&](const Json& name, const std::string& where) -> std::string {
    if (name.type != Json::Type::String || name.s.empty() || name.s.size() > kinds().bound("MAX_STRING"))
      format_error(where + ": bad tensor name " + name.repr());
    if (slots.count(name.s)) format_error(where + ": tensor " + name.repr() + " defined twice");
    return name.s;
  };
  size_t max_tensors = kinds().bound("MAX_TENSORS");
  const auto& raw_inputs = list_field(&raw, "inputs", "network", max_tensors);
  for (size_t i = 0; i < raw_inputs.size(); ++i) {
    std::string where = "network input " + std::to_string(i);
    std::string name = define(field(&raw_inputs[i], "name", Json::Type::String, where), where);
    TensorInfo t{name, parse_dtype(raw_inputs[i].get("dtype"), where),
                 parse_dims(raw_inputs[i].get("shape"), where, symbols)};
    for (size_t j = 0; j < t.shape.size() && depth == 0; ++j)  // a sub-network's may be expressions
      if (!t.shape[j].is_int() && t.shape[j].op != Dim::Op::Sym)
        format_error("network input '" + name + "' dim " + std::to_string(j) +
                     ": an input dim must be an int or a single symbol");
    slots[name] = network.tensors.size();
    network.tensors.push_back(std::move(t));
  }
  network.num_inputs = network.tensors.size();
  std::vector<bool> known(symbols.size(), false);  // defined by an input dim or an earlier data-dependent layer
  for (const TensorInfo& t : network.tensors) {
    std::set<int64_t> used;
    for (const Dim& d : t.shape) symbols_in(d, used);
    for (int64_t k : used) known[k] = true;
  }
  const auto& raw_layers = list_field(&raw, "layers", "network", kinds().bound("MAX_LAYERS"));
  const auto& raw_outputs = list_field(&raw, "outputs", "network", max_tensors);
  std::vector<std::vector<std::string>> reads;
  for (const Json& entry : raw_layers) {
    std::vector<std::string> names;
    const Json* ins = entry.get("inputs");
    if (ins && ins->type == Json::Type::Array)
      for (const Json& n : ins->array)
        if (n.type == Json::Type::String) names.push_back(n.s);
    reads.push_back(std::move(names));
  }
  std::vector<std::string> kept;
  for (const Json& n : raw_outputs)
    if (n.type == Json::Type::String) kept.push_back(n.s);
  Budget budget(max_memory, max_flops, reads, kept);
  std::set<std::string> layer_names;
  for (size_t i = 0; i < raw_layers.size(); ++i) {
    const Json& entry = raw_layers[i];
    std::string where = (depth ? Json{Json::Type::String, false, 0, 0, network.name.substr(0, 60)}.repr() + " " : "") +
                        "layer " + std::to_string(i);
    if (++count > (size_t)kinds().bound("MAX_LAYERS"))
      format_error(where + ": the engine holds more than " + std::to_string(kinds().bound("MAX_LAYERS")) +
                   " layers with its sub-networks");
    const std::string& kind_name = field(&entry, "kind", Json::Type::String, where).s;
    const KindInfo* kind = kinds().find(kind_name);
    if (!kind) format_error(where + ": unknown layer kind " + Json{Json::Type::String, false, 0, 0, kind_name}.repr());
    const std::string& name = field(&entry, "name", Json::Type::String, where).s;
    where += " (" + kind_name + " '" + name.substr(0, 60) + "')";
    if (name.empty() || name.size() > kinds().bound("MAX_STRING")) format_error(where + ": bad layer name");
    Layer layer;
    layer.kind = kind_name;
    layer.name = name;
    for (const Json& tname : list_field(&entry, "inputs", where, max_tensors)) {
      if (tname.type != Json::Type::String || !slots.count(tname.s))
        format_error(where + ": input " + tname.repr() + " is not defined before this layer");
      layer.inputs.push_back(slots[tname.s]);
    }
    for (const auto& [wname, key] : field(&entry, "weights", Json::Type::Object, where).object) {
      bool known = std::find(kind->weights.begin(), kind->weights.end(), wname) != kind->weights.end();
      if (!known || key.type != Json::Type::String || !weights.count(key.s))
        format_error(where + ": weight '" + wname + "' -> " + key.repr() + " is unknown or missing");
      layer.weights[wname] = weights.at(key.s);
    }
    const Json& raw_params = field(&entry, "params", Json::Type::Object, where);
    size_t given = 0;
    for (const auto& [pname, type] : kind->params) {
      const Json* value = raw_params.get(pname);
      given += value != nullptr;
      auto fallback = kind->defaults.find(pname);
      if (!value && fallback != kind->defaults.end()) value = &fallback->second;  // written before it existed
      if (!value) format_error(where + ": missing parameter '" + pname + "'");
      layer.params[pname] = decode(type, *value, where + " parameter '" + pname + "'", symbols);
    }
    if (raw_params.object.size() != given) {
      std::string extra;
      for (const auto& [k, v] : raw_params.object)
        if (!layer.params.count(k)) extra += (extra.empty() ? "'" : ", '") + k + "'";
      format_error(where + ": unknown parameters [" + extra + "]");
    }
    if (!layer_names.insert(name).second) format_error(where + ": layer name used twice");
    decode_subnetworks(layer, *kind, entry, where, weights, max_memory, max_flops, symbols, depth, count);
    validate_layer(layer, network.tensors, symbols, where);
    std::vector<const TensorInfo*> results = result_types(layer, network.tensors);
    check_defined(layer, results, known, symbols, where);
    layer.meaning = meaning_of(kind_name);
    std::vector<at::Tensor> inferred = layer.subnetworks.empty()
                                           ? infer_outputs(layer, network.tensors, highest, max_memory, where)
                                           : on_meta(results, highest);
    const auto& declared = list_field(&entry, "outputs", where, max_tensors);
    if (declared.size() != inferred.size())
      format_error(where + ": declares " + std::to_string(declared.size()) + " outputs, the layer has " +
                   std::to_string(inferred.size()));
    for (size_t k = 0; k < declared.size(); ++k) {
      const Json& spec = declared[k];
      std::string oname = define(field(&spec, "name", Json::Type::String, where), where);
      TensorInfo out{oname, parse_dtype(spec.get("dtype"), where), parse_dims(spec.get("shape"), where, symbols)};
      std::vector<int64_t> expected;
      for (const Dim& d : out.shape) expected.push_back(d.eval(highest));
      if (inferred[k].sizes().vec() != expected || inferred[k].scalar_type() != out.dtype)
        format_error(where + ": output '" + oname + "' declared '" + dtype_text(out.dtype) + "'" +
                     shape_text(out.shape, highest) + " but the layer computes " +
                     dtype_text(inferred[k].scalar_type()) + "[" + c10::Join(", ", inferred[k].sizes()) + "]");
      if (out.shape.size() > kinds().bound("MAX_RANK"))
        format_error(where + ": output " + std::to_string(k) + " has rank " + std::to_string(out.shape.size()));
      if (layer.kind == "constant") out.constant = layer.weights.at("value");
      slots[oname] = network.tensors.size();
      layer.outputs.push_back(network.tensors.size());
      network.tensors.push_back(std::move(out));
    }
    budget.add(i, layer, network.tensors, highest, where);
    network.layers.push_back(std::move(layer));
  }
  std::set<std::string> marked;
  for (const Json& tname : raw_outputs) {
    if (tname.type != Json::Type::String || !slots.count(tname.s) || !marked.insert(tname.s).second)
      format_error("network output " + tname.repr() + " is not defined or listed twice");
    network.outputs.push_back(slots[tname.s]);
  }
  // Where each intermediate is freed (executor.py): after its last reader, or where it is made if nothing reads it.
  std::map<int, size_t> last_reader;
  for (size_t i = 0; i < network.layers.size(); ++i)
    for (int s : network.layers[i].inputs) last_reader[s] = i;
  for (size_t i = 0; i < network.layers.size(); ++i)
    for (int s : network.layers[i].outputs) last_reader.emplace(s, i);
  std::set<int> outputs(network.outputs.begin(), network.outputs.end());
  for (auto [s, i] : last_reader)
    if (!outputs.count(s)) network.layers[i].frees.push_back(s);
  std::map<int, const Layer*> producer;
  for (const Layer& l : network.layers)
    for (int s : l.outputs) producer[s] = &l;
  for (int s : network.outputs) {
    bool alias = true;
    for (int t = s; producer.count(t);) {
      const Layer* p = producer[t];
      if (!may_alias(p->kind)) {
        alias = false;
        break;
      }
      if (p->kind == "constant") break;
      t = p->inputs[0];
    }
    network.clone_output.push_back(alias);
  }
}

std::string describe_target(const Json& plan) {
  const Json* t = plan.get("target");
  if (!t || t->type != Json::Type::Object) format_error("engine plan: no target");
  std::vector<std::string> parts;
  for (const char* key : {"backend", "device_type", "device_name", "capability"}) {
    const Json* v = t->get(key);
    if (!v || v->type != Json::Type::String) format_error("engine plan: bad target");
    if (!v->s.empty()) parts.push_back(std::string(key) == "capability" ? "sm " + v->s : v->s);
  }
  std::string libs;
  const Json* raw = t->get("libraries");
  if (raw && raw->type == Json::Type::Array)
    for (const Json& kv : raw->array)
      if (kv.type == Json::Type::Array && kv.array.size() == 2 && kv.array[0].type == Json::Type::String &&
          kv.array[1].type == Json::Type::String)
        libs += (libs.empty() ? "" : ", ") + kv.array[0].s + " " + kv.array[1].s;
  if (!libs.empty()) parts.push_back(libs);
  return c10::Join(" / ", parts);
}

}  // namespace

bool holds_tapes(const uint8_t* data, size_t size) {
  if (size < kHeader || std::memcmp(data, kMagic, 8) != 0 || read_le<uint32_t>(data + 8) != 2) return false;
  uint64_t count = read_le<uint32_t>(data + 12);
  if (count > (uint64_t)kinds().bound("MAX_SECTIONS") || kHeader + count * kSection > size) return false;
  for (uint64_t k = 0; k < count; ++k)
    if (std::memcmp(data + kHeader + k * kSection, "tape.", 5) == 0) return true;
  return false;
}

std::shared_ptr<Engine> Engine::deserialize(const uint8_t* data, size_t size, const Limits& limits) {
  if (size < kPrefixV1 + kDigest)
    format_error("engine data is truncated: " + std::to_string(size) + " bytes is shorter than any engine");
  if (std::memcmp(data, kMagic, 8) != 0) format_error("not a torchkiln engine (bad magic bytes)");
  uint32_t version = read_le<uint32_t>(data + 8);
  int64_t current = kinds().bound("FORMAT_VERSION");
  if (version > current)
    format_error("engine format version " + std::to_string(version) + " is newer than this torchkiln reads (up to " +
                 std::to_string(current) + "); upgrade torchkiln to load it");
  if (version < 1) format_error("engine format version " + std::to_string(version) + " is unknown");
  Sections sections = version == 1 ? sections_v1(data, size) : sections_v2(data, size);
  auto [graph_data, graph_size] = sections["graph"];
  if (graph_size > (size_t)kinds().bound("MAX_GRAPH_BYTES"))
    format_error("engine graph of " + std::to_string(graph_size) + " bytes exceeds the " +
                 std::to_string(kinds().bound("MAX_GRAPH_BYTES")) + "-byte limit");
  size_t meta_bytes = 0;
  for (const auto& [k, v] : sections)
    if (k != "graph" && k != "weights" && k.rfind("tape.", 0) != 0) meta_bytes += v.second;
  if (meta_bytes > (size_t)kinds().bound("MAX_META_BYTES"))
    format_error("engine metadata and plans of " + std::to_string(meta_bytes) + " bytes exceed the " +
                 std::to_string(kinds().bound("MAX_META_BYTES")) + "-byte limit");
  Json graph = parse_json(reinterpret_cast<const char*>(graph_data), graph_size);
  std::map<std::string, at::Tensor> weights;
  if (sections.count("weights")) weights = read_safetensors(sections["weights"].first, sections["weights"].second);
  if (graph.type != Json::Type::Object) format_error("engine graph must be a JSON object");
  Json meta_owned;
  const Json* meta;
  const Json* raw_network;
  if (version == 1) {
    meta = &graph;
    raw_network = &field(&graph, "network", Json::Type::Object, "engine");
  } else {
    meta_owned = parse_json(reinterpret_cast<const char*>(sections["meta"].first), sections["meta"].second);
    if (meta_owned.type != Json::Type::Object) format_error("engine metadata must be a JSON object");
    meta = &meta_owned;
    raw_network = &graph;
  }
  std::vector<std::pair<int, Json>> plans;
  for (const auto& [k, v] : sections)
    if (k.rfind("plan.", 0) == 0)
      plans.emplace_back(std::stoi(k.substr(5)), parse_json(reinterpret_cast<const char*>(v.first), v.second));
  std::sort(plans.begin(), plans.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const Json* device = meta->get("device_type");
  std::string device_type = device && device->type == Json::Type::String && device->s == "cuda" ? "cuda" : "cpu";
  auto engine = std::make_shared<Engine>();
  field(raw_network, "name", Json::Type::String, "network");
  engine->symbols = parse_symbols(raw_network->get("symbols"));
  size_t count = 0;
  decode_graph(engine->network, *raw_network, weights, max_engine_memory(limits.max_memory, device_type),
               max_engine_flops(limits.max_flops, device_type), engine->symbols, 0, count);
  std::vector<std::pair<int, std::pair<const uint8_t*, size_t>>> tapes;
  for (const auto& [k, v] : sections)
    if (k.rfind("tape.", 0) == 0) tapes.emplace_back(std::stoi(k.substr(5)), v);
  std::sort(tapes.begin(), tapes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = 0; k < tapes.size(); ++k) {
    auto [bytes, n] = tapes[k].second;
    engine->tapes.push_back(
        std::make_shared<const Tape>(parse_tape(bytes, n, "engine tape " + std::to_string(k), engine->network)));
  }
  // The metadata (runtime/engine.py's Engine.deserialize).
  const Json* name = meta->get("name");
  if (!name || name->type != Json::Type::String || name->s.size() > kinds().bound("MAX_STRING") || !device ||
      device->type != Json::Type::String || (device->s != "cpu" && device->s != "cuda"))
    format_error("engine metadata: bad name or device_type");
  engine->name = name->s;
  engine->network.what = "engine " + q(name->s);  // run-time messages name the engine, not its network
  engine->device_type = device->s;
  const Json* raw_bindings = meta->get("bindings");
  if (!raw_bindings || raw_bindings->type != Json::Type::Array ||
      raw_bindings->array.size() > kinds().bound("MAX_TENSORS"))
    format_error("engine metadata: missing bindings or too many");
  for (size_t i = 0; i < raw_bindings->array.size(); ++i) {
    const Json& b = raw_bindings->array[i];
    std::string where = "engine binding " + std::to_string(i);
    const Json* bname = b.get("name");
    if (!bname || bname->type != Json::Type::String || bname->s.size() > kinds().bound("MAX_STRING"))
      format_error(where + ": malformed");
    Binding binding{bname->s, at::kFloat, parse_shape(b.get("min_shape"), where),
                    parse_shape(b.get("opt_shape"), where), parse_shape(b.get("max_shape"), where)};
    binding.dtype = parse_dtype(b.get("dtype"), where);
    engine->bindings.push_back(std::move(binding));
  }
  const Json* backend = meta->get("backend");
  engine->backend = backend ? (backend->type == Json::Type::String ? backend->s : "") : "reference";
  bool runs = engine->backend == "reference" || (engine->backend == "onnxruntime" && engine->device_type == "cpu") ||
              (engine->backend == "cuda" && engine->device_type == "cuda");
  if (!runs)
    format_error("engine metadata: backend " + (backend ? backend->repr() : "None") + " is not one that runs on " +
                 engine->device_type + " (" +
                 (engine->device_type == "cpu" ? "reference, onnxruntime" : "reference, cuda") + ")");
  for (const OptionInfo& option : kinds().options) {  // BackendOptions.from_json's checks
    const Json* value = meta->get(option.name);
    if (!value) continue;
    if (option.type == "bool" && value->type != Json::Type::Bool)
      format_error("engine metadata: " + option.name + " must be True or False, got " + value->repr());
    if (option.name == "cuda_graphs") engine->cuda_graphs = value->b;  // the one option this runtime follows
    if (option.type == "int" &&
        !(value->is_int() && value->i >= option.low && (option.high < 0 || value->i <= option.high)))
      format_error("engine metadata: " + option.name + " must be an int >= " + std::to_string(option.low) +
                   (option.high < 0 ? "" : " and <= " + std::to_string(option.high)) +
                   (option.note.empty() ? "" : " (" + option.note + ")") + ", got " + value->repr());
  }
  for (const auto& [k, plan] : plans) {
    if (plan.type != Json::Type::Object) format_error("engine plan " + std::to_string(k) + ": not an object");
    const Json* target_backend = plan.get("target") ? plan.get("target")->get("backend") : nullptr;
    if (target_backend && target_backend->type == Json::Type::String && target_backend->s != engine->backend)
      format_error("engine metadata: a plan is for another backend than the engine's '" + engine->backend + "'");
    engine->plan_targets.push_back(describe_target(plan));
  }
  engine->precision = parse_dtype(meta->get("precision"), "engine precision");
  // The bindings against the network's inputs (InputBinding.check_against).
  if (engine->bindings.size() != (size_t)engine->network.num_inputs)
    format_error("engine '" + engine->name + "': " + std::to_string(engine->bindings.size()) + " bindings for " +
                 std::to_string(engine->network.num_inputs) + " inputs");
  for (int i = 0; i < engine->network.num_inputs; ++i) {
    const Binding& b = engine->bindings[i];
    const TensorInfo& t = engine->network.tensors[i];
    std::vector<std::string> dims;
    for (const Dim& d : t.shape)
      dims.push_back(d.op == Dim::Op::Sym ? engine->symbols[d.value].name : std::to_string(d.value));
    std::string what = "engine '" + engine->name + "': binding '" + b.name + "' (min [" + c10::Join(", ", b.min_shape) +
                       "], opt [" + c10::Join(", ", b.opt_shape) + "], max [" + c10::Join(", ", b.max_shape) +
                       "], torch." + dtype_text(b.dtype) + ") for network input %" + t.name + ": " +
                       dtype_text(t.dtype) + "[" + c10::Join(", ", dims) + "]";
    if (b.dtype != t.dtype) format_error(what + ": the dtypes differ");
    if (b.min_shape.size() != t.shape.size() || b.opt_shape.size() != t.shape.size() ||
        b.max_shape.size() != t.shape.size())
      format_error(what + ": the ranks differ");
    for (size_t j = 0; j < t.shape.size(); ++j) {
      int64_t lo = b.min_shape[j], opt = b.opt_shape[j], hi = b.max_shape[j];
      std::string dim = ": dim " + std::to_string(j);
      if (!(0 <= lo && lo <= opt && opt <= hi)) format_error(what + dim + " needs 0 <= min <= opt <= max");
      const Dim& d = t.shape[j];
      if (d.op == Dim::Op::Sym) {
        const Symbol& s = engine->symbols[d.value];
        if (lo != s.lo || hi != s.hi)
          format_error(what + dim + " is the network's symbol " + s.name + " in [" + std::to_string(s.lo) + ", " +
                       std::to_string(s.hi) + "], which the binding's range [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "] must equal");
      } else if (!(lo == opt && opt == hi && hi == d.value)) {
        format_error(what + ": the network's fixed dim " + std::to_string(j) + " of " + std::to_string(d.value) +
                     " needs min = opt = max = " + std::to_string(d.value));
      }
    }
  }
  return engine;
}

}  // namespace torchkiln
