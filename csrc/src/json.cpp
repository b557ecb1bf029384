#include "json.h"

#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <cerrno>
#include <cstdlib>

#include "torchkiln/engine.h"

namespace torchkiln {
namespace {

constexpr size_t kMaxDepth = 900;     // Python's json gives up near its recursion limit (1000)
constexpr size_t kMaxIntDigits = 20;  // serialization.MAX_INT_DIGITS

struct Builder : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, Builder> {
  std::vector<Json*> stack;
  std::vector<std::string> keys;
  Json root;
  std::string problem;
  bool constants = true;

  Json* add(Json value) {
    if (stack.empty()) {
      root = std::move(value);
      return &root;
    }
    Json* top = stack.back();
    if (top->type == Json::Type::Array) {
      top->array.push_back(std::move(value));
      return &top->array.back();
    }
    Json& slot = top->object[keys.back()];  // a repeated key keeps its last value, as Python's json does
    slot = std::move(value);
    return &slot;
  }
  bool Null() {
    add(Json{});
    return true;
  }
  bool Bool(bool b) {
    Json j;
    j.type = Json::Type::Bool;
    j.b = b;
    add(std::move(j));
    return true;
  }
  bool RawNumber(const char* text, rapidjson::SizeType length, bool) {
    std::string t(text, length);
    Json j;
    if (t == "NaN" || t == "Infinity" || t == "-Infinity") {
      if (!constants) {
        problem = t + " (not JSON)";
        return false;
      }
      j.type = Json::Type::Float;
      j.f = std::strtod(t.c_str(), nullptr);
    } else if (t == "Inf" || t == "-Inf" || t == "-NaN") {
      problem = "not valid JSON: " + t;
      return false;
    } else if (t.find_first_of(".eE") == std::string::npos) {
      size_t digits = t.size() - (t[0] == '-');
      if (digits > kMaxIntDigits) {
        problem =
            "holds an integer of " + std::to_string(digits) + " digits (at most " + std::to_string(kMaxIntDigits) + ")";
        return false;
      }
      errno = 0;
      long long v = std::strtoll(t.c_str(), nullptr, 10);
      j.type = errno == ERANGE ? Json::Type::BigInt : Json::Type::Int;
      j.i = v;
    } else {
      j.type = Json::Type::Float;
      j.f = std::strtod(t.c_str(), nullptr);  // correctly rounded, as Python's float()
    }
    add(std::move(j));
    return true;
  }
  bool String(const char* text, rapidjson::SizeType length, bool) {
    Json j;
    j.type = Json::Type::String;
    j.s.assign(text, length);
    add(std::move(j));
    return true;
  }
  bool open(Json::Type type) {
    if (stack.size() >= kMaxDepth) {
      problem = "nested too deeply";
      return false;
    }
    Json j;
    j.type = type;
    stack.push_back(add(std::move(j)));
    return true;
  }
  bool StartObject() { return open(Json::Type::Object); }
  bool Key(const char* text, rapidjson::SizeType length, bool) {
    keys.emplace_back(text, length);
    return true;
  }
  bool EndObject(rapidjson::SizeType members) {
    keys.resize(keys.size() - members);
    stack.pop_back();
    return true;
  }
  bool StartArray() { return open(Json::Type::Array); }
  bool EndArray(rapidjson::SizeType) {
    stack.pop_back();
    return true;
  }
};

}  // namespace

const Json* Json::get(const std::string& key) const {
  if (type != Type::Object) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

std::string Json::repr(size_t limit) const {
  std::string out;
  switch (type) {
    case Type::Null:
      out = "None";
      break;
    case Type::Bool:
      out = b ? "True" : "False";
      break;
    case Type::Int:
      out = std::to_string(i);
      break;
    case Type::BigInt:
      out = "<an integer beyond int64>";
      break;
    case Type::Float:
      out = std::to_string(f);
      break;
    case Type::String:
      out = "'" + s + "'";
      break;
    case Type::Array: {
      out = "[";
      for (size_t k = 0; k < array.size() && out.size() < limit; ++k) out += (k ? ", " : "") + array[k].repr(limit);
      out += "]";
      break;
    }
    case Type::Object: {
      out = "{";
      bool first = true;
      for (const auto& [k, v] : object) {
        if (out.size() >= limit) break;
        out += (first ? "'" : ", '") + k + "': " + v.repr(limit);
        first = false;
      }
      out += "}";
    }
  }
  return out.size() > limit ? out.substr(0, limit) + "..." : out;
}

Json parse_json(const char* data, size_t size, const std::string& what, bool constants) {
  Builder builder;
  builder.constants = constants;
  rapidjson::MemoryStream stream(data, size);
  rapidjson::Reader reader;
  constexpr unsigned kFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag |
                              rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseValidateEncodingFlag;
  rapidjson::ParseResult ok = reader.Parse<kFlags>(stream, builder);
  if (!ok) {
    if (builder.problem == "nested too deeply") format_error(what + " is nested too deeply to be an engine");
    if (!builder.problem.empty() && builder.problem.rfind("holds", 0) == 0) format_error(what + " " + builder.problem);
    std::string why = builder.problem.empty() ? rapidjson::GetParseError_En(ok.Code()) : builder.problem;
    format_error(what + " is not valid JSON: " + why + " (at byte " + std::to_string(ok.Offset()) + ")");
  }
  return std::move(builder.root);
}

}  // namespace torchkiln
