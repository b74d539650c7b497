#pragma once
// A registry of component kinds by name (lt::models::ModelKind, lt::data::DataKind): the
// part both registries share. Kind needs `name` and `options` (an OptionTable). Kinds are
// never removed, and a deque keeps references to them valid while others are added.
// Thread-safe. Torch-free.
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/options.h"

namespace lt {

template <class Kind>
class KindRegistry {
 public:
  /// `section`: the config section the kinds fill ("model", "data"), for messages.
  explicit KindRegistry(std::string section) : section_(std::move(section)) {}

  /// Adds a kind; std::invalid_argument if its name is empty or taken.
  void add(Kind kind) {
    if (kind.name.empty()) throw std::invalid_argument("register a " + section_ + " kind: it needs a name");
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& k : kinds_)
      if (k.name == kind.name)
        throw std::invalid_argument(section_ + " kind \"" + kind.name + "\" is already registered");
    kinds_.push_back(std::move(kind));
  }

  /// The kind named `name`; ConfigError "<section>.kind = ..." listing the registered names.
  const Kind& find(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string names;
    for (const auto& k : kinds_) {
      if (k.name == name) return k;
      names += (names.empty() ? "" : " | ") + k.name;
    }
    throw ConfigError(section_ + ".kind = \"" + name + "\": no such " + section_ + " kind; registered: " + names);
  }

  /// The registered names, in registration order.
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& k : kinds_) out.push_back(k.name);
    return out;
  }

  /// `given` resolved against kind `name`'s table (resolve_options), after dropping the keys
  /// of the section's other kinds (without_other_kinds_keys; each dropped key is logged).
  Options resolve(const std::string& name, const Options& given) const {
    const Kind& kind = find(name);
    std::vector<std::pair<std::string, const OptionTable*>> others;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& k : kinds_)
        if (k.name != name) others.emplace_back(k.name, &k.options);
    }
    std::vector<std::string> dropped;
    const Options own = without_other_kinds_keys(section_, kind.options, others, given, &dropped);
    for (const auto& d : dropped) log::info("ignoring " + d + ": " + section_ + ".kind is " + name);
    return resolve_options(section_, name, kind.options, own);
  }

 private:
  std::string section_;
  mutable std::mutex mu_;
  std::deque<Kind> kinds_;
};

}  // namespace lt
