// Engine JSON, read with RapidJSON's SAX reader into a small tree, with the Python loader's rules
// (runtime/serialization.py): integers of at most MAX_INT_DIGITS digits, NaN/Infinity/-Infinity as Python's json
// reads them, an object's repeated key keeps its last value, and nesting bounded before it is a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torchkiln {

struct Json {
  enum class Type { Null, Bool, Int, BigInt, Float, String, Array, Object };
  Type type = Type::Null;
  bool b = false;
  int64_t i = 0;  // Int (BigInt: an integer beyond int64, which no field accepts)
  double f = 0;
  std::string s;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool is_int() const { return type == Type::Int; }
  bool is_number() const { return type == Type::Int || type == Type::BigInt || type == Type::Float; }
  const Json* get(const std::string& key) const;  // the member, or null (also where this is no object)
  std::string repr(size_t limit = 60) const;      // short text for messages
};

// Parse `size` bytes of JSON; EngineFormatError with `what` ("engine graph") naming what is wrong. `constants`:
// NaN, Infinity and -Infinity are read (Python's json.loads reads them; a tape's reader refuses them).
Json parse_json(const char* data, size_t size, const std::string& what = "engine graph", bool constants = true);

}  // namespace torchkiln
