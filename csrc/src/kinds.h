// The engine format's description (csrc/layer_kinds.json, rendered from the Python layer registry by
// scripts/render_layer_kinds.py): layer kinds with their parameters' types, weights and input counts; the bounds.
#pragma once

#include <ATen/ATen.h>

#include "json.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torchkiln {

struct KindInfo {
  std::vector<std::pair<std::string, std::string>> params;  // (name, type) in declaration order
  std::map<std::string, Json> defaults;  // a parameter an engine may leave out (written before it existed)
  std::vector<std::string> weights, required_weights;
  std::vector<at::ScalarType> weight_dtypes;
  int64_t min_inputs = 1, max_inputs = -1;  // -1: any number
  std::vector<std::string> subnetworks;      // control flow: the sub-networks its entry holds, in order
};

struct OptionInfo {              // a backend option of engine metadata (runtime/backends/base.py)
  std::string name, type, note;  // type: "bool" or "int" (others are not checked)
  int64_t low = 0, high = -1;    // an int's range; high -1: none
};

struct Kinds {
  std::vector<OptionInfo> options;
  std::map<std::string, KindInfo> kinds;
  std::map<std::string, std::vector<std::string>> enums;
  std::map<std::string, at::ScalarType> dtypes;
  std::vector<at::ScalarType> float_dtypes;
  std::map<std::string, int64_t> bounds;

  const KindInfo* find(const std::string& kind) const;
  int64_t bound(const std::string& name) const { return bounds.at(name); }
  std::string dtype_name(at::ScalarType t) const;
};

const Kinds& kinds();

// "float32[2, 3], int64[2]": tensors' dtypes and shapes, for messages.
std::string tensors_text(const std::vector<std::pair<at::ScalarType, std::vector<int64_t>>>& specs);
std::string tensors_text(at::TensorList tensors);

}  // namespace torchkiln
