// Ceilings on what an engine may plan, counted on shapes before anything is allocated (runtime/limits.py and the
// per-kind costs of ir/cost.py).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "torchkiln/engine.h"

namespace torchkiln {

double max_engine_memory(std::optional<double> value, const std::string& device_type);
double max_engine_flops(std::optional<double> value, const std::string& device_type);

class Budget {
 public:
  Budget(double max_memory, double max_flops, const std::vector<std::vector<std::string>>& reads,
         const std::vector<std::string>& kept);
  // Add layer `index` (its outputs already in `tensors`); EngineFormatError where it goes over a ceiling.
  void add(size_t index, const Layer& layer, const std::vector<TensorInfo>& tensors,
           const std::vector<int64_t>& highest, const std::string& where);

 private:
  double max_memory_, max_flops_;
  std::map<size_t, std::vector<std::string>> frees_;
  std::map<std::string, size_t> reads_;
  std::set<std::string> kept_;
  std::map<std::string, double> live_;
  double live_bytes_ = 0, weight_bytes_ = 0, flops_ = 0;
  std::set<const void*> weights_;
};

}  // namespace torchkiln
