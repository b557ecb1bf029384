// torchkiln_check_engine [--max-memory BYTES] [--max-flops N] [--tapes] FILE...: load each engine file with the C++
// loader and print one line per file: its path, "loaded" (with --tapes: "loaded, N tapes") or the error's first
// line, and the milliseconds it took; then the process's peak resident memory. Used by tests/test_cpp_runtime.py
// (test vectors, hostile engines) and tests/test_cpp_tape.py.
#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>

#include "torchkiln/engine.h"

int main(int argc, char** argv) {
  torchkiln::Limits limits;
  int i = 1;
  bool tapes = false;
  for (; i + 1 < argc && std::string(argv[i]).rfind("--", 0) == 0; ++i) {
    std::string option = argv[i];
    if (option == "--tapes")
      tapes = true;
    else
      (option == "--max-memory" ? limits.max_memory : limits.max_flops) = std::stod(argv[++i]);
  }
  for (; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto start = std::chrono::steady_clock::now();
    std::string outcome = "loaded";
    try {
      auto engine = torchkiln::Engine::deserialize(data.data(), data.size(), limits);
      if (tapes) outcome += ", " + std::to_string(engine->tapes.size()) + " tapes";
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
