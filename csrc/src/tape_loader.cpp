// A tape section's bytes -> Tape, with the checks of runtime/tape_format.py (the same bounds and order, so that both
// loaders refuse the same bytes; messages name the tape and the instruction).
#include <cmath>
#include <cstring>
#include <set>

#include "json.h"
#include "kinds.h"
#include "tape.h"
#include "torchkiln/engine.h"

namespace torchkiln {
namespace {

constexpr char kMagic[8] = {'T', 'K', 'T', 'A', 'P', 'E', '\0', '\0'};
constexpr size_t kHeader = 8 + 4 + 8;
constexpr uint64_t kMaxJson = uint64_t(64) << 20;
constexpr int64_t kMaxValues = int64_t(1) << 20;
constexpr size_t kMaxInstructions = size_t(1) << 20;
constexpr int64_t kMaxDim = int64_t(1) << 62;
constexpr std::array<int64_t, 3> kMaxGrid = {(int64_t(1) << 31) - 1, (1 << 16) - 1, (1 << 16) - 1};
const std::set<std::string> kScalarParams = {"i1", "i8",  "i16", "i32",  "i64",  "u1",   "u8",
                                             "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64"};
const std::vector<std::string> kMemoryFormats = {"contiguous_format", "channels_last", "channels_last_3d",
                                                 "preserve_format"};
const char* const kInstructions[] = {"weight", "constant", "op", "launch"};

using Wide = unsigned __int128;
constexpr Wide kCap = Wide(1) << 120;  // beyond any blob: a product or sum past it is refused all the same
Wide capped(Wide v) { return v > kCap ? kCap : v; }

std::string decimal(Wide v) {
  std::string out;
  do out.insert(out.begin(), char('0' + int(v % 10))); while (v /= 10);
  return out;
}

class Checker {
 public:
  Checker(const std::string& where, const Network& network, const uint8_t* blob, size_t blob_size)
      : where_(where), network_(network), blob_(blob), blob_size_(blob_size) {}

  Tape run(const Json& doc) {
    Tape tape;
    tape.where = where_;
    const Json& target = field(doc, "target", Json::Type::Object, "tape");
    std::string* parts[] = {&tape.target.device_type, &tape.target.device_name, &tape.target.capability,
                            &tape.target.torch, &tape.target.triton};
    const char* keys[] = {"device_type", "device_name", "capability", "torch", "triton"};
    for (size_t k = 0; k < 5; ++k) {
      *parts[k] = field(target, keys[k], Json::Type::String, "target").s;
      if (parts[k]->size() > 256) fail(std::string("target ") + keys[k] + " is too long");
    }
    if (tape.target.device_type != "cpu" && tape.target.device_type != "cuda")
      fail("target device_type '" + tape.target.device_type.substr(0, 20) + "' is not cpu or cuda");
    const auto& inputs = field(doc, "inputs", Json::Type::Array, "tape").array;
    int64_t num_inputs = network_.num_inputs;
    if ((int64_t)inputs.size() != num_inputs)
      fail(std::to_string(inputs.size()) + " inputs for an engine of " + std::to_string(num_inputs));
    for (size_t k = 0; k < inputs.size(); ++k) {
      std::string what = "input " + std::to_string(k);
      at::ScalarType dtype = dtype_of(field(inputs[k], "dtype", Json::Type::String, what).s, what);
      tape.inputs.emplace_back(dtype, shape(field(inputs[k], "shape", Json::Type::Array, what), what));
    }
    num_values_ = tape.num_values = integer(doc.get("num_values"), num_inputs, kMaxValues, "num_values");
    written_.assign(num_values_, false);
    for (int64_t k = 0; k < num_inputs; ++k) written_[k] = true;
    for (const Json& raw : field(doc, "kernels", Json::Type::Array, "tape").array)
      tape.kernels.push_back(kernel(raw, "kernel " + std::to_string(tape.kernels.size())));
    for (const Json& raw : field(doc, "constants", Json::Type::Array, "tape").array)
      tape.constants.push_back(constant(raw, "constant " + std::to_string(tape.constants.size())));
    kernels_ = &tape.kernels;
    num_constants_ = tape.constants.size();
    const auto& prologue = field(doc, "prologue", Json::Type::Array, "tape").array;
    const auto& body = field(doc, "body", Json::Type::Array, "tape").array;
    if (prologue.size() + body.size() > kMaxInstructions)
      fail(std::to_string(prologue.size() + body.size()) + " instructions (at most " +
           std::to_string(kMaxInstructions) + ")");
    for (const Json& raw : prologue)
      tape.prologue.push_back(instruction(raw, "prologue instruction " + std::to_string(tape.prologue.size())));
    for (const Json& raw : body)
      tape.body.push_back(instruction(raw, "body instruction " + std::to_string(tape.body.size())));
    const auto& outputs = field(doc, "outputs", Json::Type::Array, "tape").array;
    if (outputs.size() != network_.outputs.size())
      fail(std::to_string(outputs.size()) + " outputs for an engine of " + std::to_string(network_.outputs.size()));
    for (const Json& value : outputs) tape.outputs.push_back(read(&value, "outputs"));
    return tape;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { format_error(where_ + ": " + message); }

  const Json& field(const Json& obj, const std::string& key, Json::Type type, const std::string& what) const {
    static const std::map<Json::Type, const char*> names = {
        {Json::Type::Object, "dict"}, {Json::Type::Array, "list"}, {Json::Type::String, "str"}};
    const Json* v = obj.get(key);
    if (!v || v->type != type) fail(what + ": '" + key + "' is missing or not a " + names.at(type));
    return *v;
  }

  int64_t integer(const Json* v, int64_t lo, int64_t hi, const std::string& what) const {
    if (!v || !v->is_int() || v->i < lo || v->i > hi)
      fail(what + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
           (v ? v->repr(40) : "None"));
    return v->i;
  }

  std::pair<size_t, size_t> blob_range(const Json* raw, const std::string& what) const {
    if (!raw || raw->type != Json::Type::Array || raw->array.size() != 2)
      fail(what + ": a blob range is [offset, length]");
    int64_t offset = integer(&raw->array[0], 0, blob_size_, what + " offset");
    int64_t length = integer(&raw->array[1], 0, blob_size_ - offset, what + " length");
    return {(size_t)offset, (size_t)length};
  }

  at::ScalarType dtype_of(const std::string& name, const std::string& what) const {
    auto found = kinds().dtypes.find(name);
    if (found == kinds().dtypes.end()) fail(what + ": unknown dtype");
    return found->second;
  }

  std::vector<int64_t> shape(const Json& raw, const std::string& what) const {
    if (raw.array.size() > 64) fail(what + ": rank " + std::to_string(raw.array.size()) + " is over 64");
    std::vector<int64_t> out;
    for (const Json& d : raw.array) out.push_back(integer(&d, 0, kMaxDim, what + " dim"));
    return out;
  }

  TapeKernel kernel(const Json& raw, const std::string& what) const {
    TapeKernel k;
    k.name = field(raw, "name", Json::Type::String, what).s;
    if (k.name.size() > 1024) fail(what + ": name too long");
    auto [offset, length] = blob_range(raw.get("cubin"), what + " cubin");
    k.cubin.assign(reinterpret_cast<const char*>(blob_ + offset), length);
    k.num_warps = integer(raw.get("num_warps"), 1, 32, what + " num_warps");
    if (k.num_warps & (k.num_warps - 1))
      fail(what + ": num_warps " + std::to_string(k.num_warps) + " is not a power of two");
    k.shared = integer(raw.get("shared"), 0, int64_t(1) << 30, what + " shared");
    const auto& params = field(raw, "params", Json::Type::Array, what).array;
    for (const Json& p : params) {
      bool ok = p.type == Json::Type::String &&
                (kScalarParams.count(p.s) || (p.s.rfind("*", 0) == 0 && kScalarParams.count(p.s.substr(1))));
      if (!ok || params.size() > 1024)
        fail(what + ": params must be at most 1024 of i1, i8, i16, i32, i64, u1, u8, u16, u32, u64, fp16, bf16, "
                    "fp32, fp64 or pointers to them");
      k.params.push_back(p.s);
    }
    return k;
  }

  TapeConstant constant(const Json& raw, const std::string& what) const {
    at::ScalarType dtype = dtype_of(field(raw, "dtype", Json::Type::String, what).s, what);
    std::vector<int64_t> dims = shape(field(raw, "shape", Json::Type::Array, what), what);
    const auto& strides = field(raw, "strides", Json::Type::Array, what).array;
    if (strides.size() != dims.size())
      fail(what + ": " + std::to_string(strides.size()) + " strides for rank " + std::to_string(dims.size()));
    Wide numel = 1;
    for (int64_t d : dims) numel = capped(numel * (Wide)d);
    TapeConstant c;
    if (numel) {  // the strides of an empty constant are not read (tape_format.py: neither there)
      Wide extent = 1;
      for (size_t k = 0; k < dims.size(); ++k) {
        int64_t s = integer(&strides[k], 0, kMaxDim, what + " stride");
        extent = capped(extent + capped((Wide)(dims[k] - 1) * (Wide)s));
        c.strides.push_back(s);
      }
      if (extent > numel)
        fail(what + ": its strides reach " + decimal(extent) + " elements, past its " + decimal(numel));
    } else {
      c.strides.assign(dims.size(), 0);
    }
    auto [offset, length] = blob_range(raw.get("data"), what + " data");
    if (numel * (Wide)at::elementSize(dtype) != length)
      fail(what + ": " + std::to_string(length) + " bytes for " + decimal(numel) + " elements of torch." +
           kinds().dtype_name(dtype));
    const Json* device = raw.get("device");
    if (!device || device->type != Json::Type::String || (device->s != "engine" && device->s != "cpu"))
      fail(what + ": device must be 'engine' or 'cpu'");
    c.on_engine = device->s == "engine";
    c.value = at::empty(dims, at::TensorOptions().dtype(dtype));
    if (length) std::memcpy(c.value.data_ptr(), blob_ + offset, length);
    return c;
  }

  int64_t read(const Json* v, const std::string& what) const {
    int64_t id = integer(v, 0, num_values_ - 1, what + ": value id");
    if (!written_[id]) fail(what + ": reads value " + std::to_string(id) + " before anything writes it");
    return id;
  }

  int64_t write(const Json* v, const std::string& what) {
    int64_t id = integer(v, 0, num_values_ - 1, what + ": value id");
    if (written_[id]) fail(what + ": writes value " + std::to_string(id) + " a second time");
    written_[id] = true;
    return id;
  }

  TapeInstruction instruction(const Json& raw, const std::string& what) {
    std::vector<std::string> present;
    for (const char* key : kInstructions)
      if (raw.get(key)) present.push_back(key);
    if (present.size() != 1) fail(what + ": an instruction has exactly one of the keys weight, constant, op, launch");
    TapeInstruction out;
    const std::string& kind = present[0];
    if (kind == "weight") {
      out.kind = TapeInstruction::Kind::Weight;
      const Json& ref = *raw.get("weight");
      if (ref.type != Json::Type::Array || ref.array.size() != 2) fail(what + ": a weight is [layer, name]");
      out.index = integer(&ref.array[0], 0, (int64_t)network_.layers.size() - 1, what + " layer");
      const Json& name = ref.array[1];
      if (name.type != Json::Type::String || !network_.layers[out.index].weights.count(name.s))
        fail(what + ": layer " + std::to_string(out.index) + " has no weight " + name.repr(60));
      out.name = name.s;
      out.out.push_back(write(raw.get("out"), what));
    } else if (kind == "constant") {
      out.kind = TapeInstruction::Kind::Constant;
      out.index = integer(raw.get("constant"), 0, (int64_t)num_constants_ - 1, what + " constant");
      out.out.push_back(write(raw.get("out"), what));
    } else if (kind == "op") {
      out.kind = TapeInstruction::Kind::Op;
      out.name = field(raw, "op", Json::Type::String, what).s;
      out.overload = field(raw, "overload", Json::Type::String, what).s;
      if (out.name.size() > 256 || out.overload.size() > 256) fail(what + ": operator name too long");
      out.args = arguments(field(raw, "args", Json::Type::Array, what).array, what, 0);
      const auto& kwargs = field(raw, "kwargs", Json::Type::Object, what).object;
      std::vector<Json> values;
      for (const auto& [key, value] : kwargs) {
        if (kwargs.size() > 64 || key.size() > 256) fail(what + ": too many or too long kwargs");
        values.push_back(value);
      }
      std::vector<TapeArg> converted = arguments(values, what, 0);
      size_t k = 0;
      for (const auto& entry : kwargs) out.kwargs.emplace_back(entry.first, std::move(converted[k++]));
      const auto& written = field(raw, "out", Json::Type::Array, what).array;
      if (written.size() > 1024) fail(what + ": over 1024 outputs");
      for (const Json& value : written)
        out.out.push_back(value.type == Json::Type::Null ? -1 : write(&value, what));
    } else {
      out.kind = TapeInstruction::Kind::Launch;
      out.index = integer(raw.get("launch"), 0, (int64_t)kernels_->size() - 1, what + " kernel");
      const auto& grid = field(raw, "grid", Json::Type::Array, what).array;
      if (grid.size() != 3) fail(what + ": a grid is [x, y, z]");
      for (size_t d = 0; d < 3; ++d) out.grid[d] = integer(&grid[d], 0, kMaxGrid[d], what + " grid");
      const auto& args = field(raw, "args", Json::Type::Array, what).array;
      const auto& params = (*kernels_)[out.index].params;
      if (args.size() != params.size())
        fail(what + ": " + std::to_string(args.size()) + " args for kernel " + std::to_string(out.index) + "'s " +
             std::to_string(params.size()) + " params");
      for (size_t k = 0; k < args.size(); ++k) {
        if (params[k][0] == '*') {
          if (args[k].type != Json::Type::Object || args[k].object.size() != 1 || !args[k].get("t"))
            fail(what + ": a pointer param takes a tensor value");
          out.args.push_back(tensor(read(args[k].get("t"), what)));
        } else {
          if (!args[k].is_number()) fail(what + ": a " + params[k] + " param takes a number");
          out.args.push_back(scalar(args[k]));
        }
      }
      const Json* pdl = raw.get("pdl");
      if (pdl && pdl->type != Json::Type::Bool) fail(what + ": 'pdl' must be true or false");
      out.pdl = pdl && pdl->b;
    }
    return out;
  }

  static TapeArg tensor(int64_t id) {
    TapeArg a;
    a.kind = TapeArg::Kind::Tensor;
    a.i = id;
    return a;
  }

  static TapeArg scalar(const Json& v) {
    TapeArg a;
    a.kind = v.type == Json::Type::Float ? TapeArg::Kind::Float
             : v.is_int()                ? TapeArg::Kind::Int
                                         : TapeArg::Kind::BigInt;
    a.i = v.i;
    a.f = v.f;
    return a;
  }

  std::vector<TapeArg> arguments(const std::vector<Json>& values, const std::string& what, int depth) const {
    if (depth > 4 || values.size() > 4096) fail(what + ": arguments nested or long past the limits");
    std::vector<TapeArg> out;
    for (const Json& v : values) {
      TapeArg a;
      switch (v.type) {
        case Json::Type::Null:
          break;
        case Json::Type::Bool:
          a.kind = TapeArg::Kind::Bool;
          a.b = v.b;
          break;
        case Json::Type::String:
          if (v.s.size() > 4096) fail(what + ": a string argument is too long");
          a.kind = TapeArg::Kind::Str;
          a.s = v.s;
          break;
        case Json::Type::Array:
          a.kind = TapeArg::Kind::List;
          a.list = arguments(v.array, what, depth + 1);
          break;
        case Json::Type::Object:
          a = tagged(v, what);
          break;
        default:
          a = scalar(v);
      }
      out.push_back(std::move(a));
    }
    return out;
  }

  TapeArg tagged(const Json& value, const std::string& what) const {
    if (value.object.size() != 1) fail(what + ": a tagged argument has one key");
    const auto& [tag, raw] = *value.object.begin();
    auto one_of = [&](const std::vector<std::string>& names, const std::string& message) -> int64_t {
      for (size_t k = 0; k < names.size(); ++k)
        if (raw.type == Json::Type::String && raw.s == names[k]) return k;
      fail(what + ": " + message);
    };
    TapeArg a;
    if (tag == "t") return tensor(read(&raw, what));
    if (tag == "float") {
      static const double values[] = {INFINITY, -INFINITY, NAN};
      a.kind = TapeArg::Kind::Float;
      a.f = values[one_of({"inf", "-inf", "nan"}, "a float is 'inf', '-inf' or 'nan'")];
    } else if (tag == "dtype") {
      a.kind = TapeArg::Kind::Dtype;
      if (raw.type != Json::Type::String || !kinds().dtypes.count(raw.s)) fail(what + ": unknown dtype");
      a.i = (int64_t)kinds().dtypes.at(raw.s);
    } else if (tag == "device") {
      a.kind = TapeArg::Kind::Device;
      a.b = one_of({"cpu", "engine"}, "a device is 'engine' or 'cpu'") == 1;
    } else if (tag == "layout") {
      a.kind = TapeArg::Kind::Layout;
      one_of({"strided"}, "the only layout is 'strided'");
      a.i = (int64_t)at::kStrided;
    } else if (tag == "memory_format") {
      static const at::MemoryFormat formats[] = {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast,
                                                 at::MemoryFormat::ChannelsLast3d, at::MemoryFormat::Preserve};
      a.kind = TapeArg::Kind::MemoryFormat;
      a.i = (int64_t)formats[one_of(kMemoryFormats, "unknown memory format")];
    } else {
      fail(what + ": unknown argument tag '" + tag.substr(0, 40) + "'");
    }
    return a;
  }

  std::string where_;
  const Network& network_;
  const uint8_t* blob_;
  int64_t blob_size_;
  int64_t num_values_ = 0;
  std::vector<bool> written_;
  const std::vector<TapeKernel>* kernels_ = nullptr;
  size_t num_constants_ = 0;
};

}  // namespace

std::string TapeTarget::describe() const {
  std::string out = device_type;
  if (!device_name.empty()) out += " " + device_name;
  if (!capability.empty()) out += " sm " + capability;
  return out + " torch " + torch;
}

Tape parse_tape(const uint8_t* data, size_t size, const std::string& where, const Network& network) {
  if (size < kHeader) format_error(where + ": truncated (" + std::to_string(size) + " bytes)");
  if (std::memcmp(data, kMagic, 8) != 0) format_error(where + ": not a tape (bad magic bytes)");
  uint32_t version;
  uint64_t n;
  std::memcpy(&version, data + 8, 4);
  std::memcpy(&n, data + 12, 8);
  if (version != 1) format_error(where + ": tape version " + std::to_string(version) + " is not 1");
  if (n > kMaxJson || kHeader + n > size)
    format_error(where + ": its JSON of " + std::to_string(n) + " bytes runs past the section or the " +
                 std::to_string(kMaxJson) + "-byte limit");
  Json doc;
  try {
    doc = parse_json(reinterpret_cast<const char*>(data + kHeader), n, "JSON", false);
  } catch (const c10::Error& e) {  // in runtime/tape_format.py's words, then RapidJSON's
    std::string text = e.what_without_backtrace();  // "EngineFormatError: JSON is not valid JSON: ..."
    format_error(where + ": its JSON does not parse (" + text.substr(text.find("JSON ") + 5) + ")");
  }
  if (doc.type != Json::Type::Object) format_error(where + ": its JSON is not an object");
  return Checker(where, network, data + kHeader + n, size - kHeader - n).run(doc);
}

}  // namespace torchkiln
