// The command line of the C++ benchmarks: `--key value` pairs and value-less `--flag`s.
#pragma once

#include <exception>
#include <functional>
#include <iostream>
#include <set>
#include <string>

namespace lt_bench {

/// Calls set(key, value) for each `--key value` (value "" for a key in `flags`). set returns
/// false for a key it does not know; a std::exception it throws (std::stoi's) means the value
/// is not a number. Returns -1 to go on, else the exit code: 0 after --help (usage printed),
/// 2 for an unknown option, a missing value or a bad number (the message names it).
inline int parse_args(int argc, char** argv, const char* usage, const std::set<std::string>& flags,
                      const std::function<bool(const std::string&, const std::string&)>& set) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::cout << usage;
      return 0;
    }
    const bool flag = flags.count(k) > 0;
    if (!flag && i + 1 == argc) {
      std::cerr << "option " << k << " needs a value (--help lists them)\n";
      return 2;
    }
    const std::string v = flag ? std::string() : argv[++i];
    try {
      if (!set(k, v)) {
        std::cerr << "unknown option " << k << " (--help lists them)\n";
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << k << " " << v << ": not a number\n";
      return 2;
    }
  }
  return -1;
}

}  // namespace lt_bench
