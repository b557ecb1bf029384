// torchkiln_check_engine [--max-memory BYTES] [--max-flops N] FILE...: load each engine file with the C++ loader
// and print one line per file: its path, "loaded" or the error's first line, and the milliseconds it took; then
// the process's peak resident memory. Used by tests/test_cpp_runtime.py (test vectors, hostile engines).
#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>

#include "torchkiln/engine.h"

int main(int argc, char** argv) {
  torchkiln::Limits limits;
  int i = 1;
  for (; i + 1 < argc && std::string(argv[i]).rfind("--max-", 0) == 0; i += 2)
    (std::string(argv[i]) == "--max-memory" ? limits.max_memory : limits.max_flops) = std::stod(argv[i + 1]);
  for (; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto start = std::chrono::steady_clock::now();
    std::string outcome = "loaded";
    try {
      torchkiln::Engine::deserialize(data.data(), data.size(), limits);
    } catch (const c10::Error& e) {
      outcome = e.what_without_backtrace();
    } catch (const std::exception& e) {
      outcome = std::string("CRASH ") + e.what();
    }
    outcome = outcome.substr(0, outcome.find('\n'));
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::cout << argv[i] << '\t' << outcome << '\t' << ms << '\n';
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::cout << "peak_rss_kib\t" << usage.ru_maxrss << '\n';
  return 0;
}
