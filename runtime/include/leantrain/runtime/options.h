#pragma once
// Options of a registered component (a model kind, a data kind): the table a component
// declares (key, type, default, rule, doc) and the values a config gives for it. The table is
// the one source for parsing (type and unknown-key checks), validation (the rules), the
// defaults config.json records, and the docs (options_markdown, printed by
// `leantrain options`). Torch-free.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace lt {

/// A value of one option; the alternative held is its type.
using OptionValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>>;

/// "true or false" | "an integer" | "a number" | "a string" | "an array of integers".
std::string option_type_name(const OptionValue& v);
/// The value as a TOML literal: 3, 0.1, "gpt", [2, 2], true.
std::string option_literal(const OptionValue& v);

/// A rule on one value: an error text ("must be >= 1") or "" when the value is allowed, and
/// the rule as the docs print it (">= 1").
struct OptionRule {
  std::string text;
  std::function<std::string(const OptionValue&)> check;
};

namespace rules {
OptionRule at_least(int64_t min);            // integer >= min (each entry of an integer array)
OptionRule in_range(double lo, bool lo_closed, double hi, bool hi_closed);  // a number in an interval
OptionRule one_of(std::vector<std::string> allowed);  // a string from a list
}  // namespace rules

struct OptionSpec {
  std::string key;
  OptionValue default_value;  // its type is the option's type
  std::string doc;
  OptionRule rule;            // empty: any value of the type
};
using OptionTable = std::vector<OptionSpec>;

/// Option values by key. A config's [model] / [data] keys are held here as parsed (TOML
/// types); resolve_options turns them into a complete, checked set.
class Options {
 public:
  void set(const std::string& key, OptionValue v) { values_[key] = std::move(v); }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  const OptionValue* find(const std::string& key) const;
  const std::map<std::string, OptionValue>& values() const { return values_; }
  bool empty() const { return values_.empty(); }

  /// Typed reads; a missing key or another type is a logic_error naming the key (a
  /// component reads only the keys of its own table, after resolve_options).
  bool flag(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  const std::string& text(const std::string& key) const;
  const std::vector<int64_t>& integers(const std::string& key) const;

  bool operator==(const Options& o) const { return values_ == o.values_; }

 private:
  std::map<std::string, OptionValue> values_;
};

/// Checks `given` against `table` and returns every option of the table: the given value
/// (an integer accepted where a number is expected) or the default. Throws ConfigError naming
/// `<section>.<key>` for a key not in the table (listing the keys of `<section>.kind` = kind),
/// a value of the wrong type, or a value its rule refuses.
Options resolve_options(const std::string& section, const std::string& kind, const OptionTable& table,
                        const Options& given);

/// `given` without the keys `own` lacks but another kind of the section has (`others`: kind
/// name -> its table): a config written for one kind and switched to another with --set keeps
/// the first kind's keys, which the second ignores. Each dropped key is described in
/// `dropped` ("model.block (an option of kind resnet)"). Keys no table has stay, for
/// resolve_options to refuse as unknown (a misspelt key is an error whatever the kind).
Options without_other_kinds_keys(const std::string& section, const OptionTable& own,
                                 const std::vector<std::pair<std::string, const OptionTable*>>& others,
                                 const Options& given, std::vector<std::string>* dropped);

/// A component kind's options as a Markdown section: a heading `### [section] kind = "name"`,
/// the doc, and a table of key | type | default | rule | meaning. docs/CONFIG.md holds
/// these sections for the built-in kinds (a test compares).
std::string options_markdown(const std::string& section, const std::string& kind, const std::string& doc,
                             const OptionTable& table);

/// Binds a table to a plain struct S: each option reads into and writes from one member,
/// and its default is that member's value in S{} (one source for both).
template <class S>
class BoundOptions {
 public:
  template <class T>
  BoundOptions& add(std::string key, T S::*member, std::string doc, OptionRule rule = {}) {
    const S defaults{};
    table_.push_back({key, OptionValue(defaults.*member), std::move(doc), std::move(rule)});
    readers_.push_back([key, member](const Options& o, S& s) { read_into(o, key, s.*member); });
    writers_.push_back([key, member](const S& s, Options& o) { o.set(key, OptionValue(s.*member)); });
    return *this;
  }
  /// Another default for `key` than S{}'s (a kind whose member default suits another kind).
  BoundOptions& set_default(const std::string& key, OptionValue v) {
    for (auto& spec : table_)
      if (spec.key == key) spec.default_value = std::move(v);
    return *this;
  }
  const OptionTable& table() const { return table_; }
  /// The struct a resolved set of options describes (members outside the table keep S{}'s).
  S read(const Options& o) const {
    S s{};
    for (const auto& r : readers_) r(o, s);
    return s;
  }
  /// The options a struct holds, for every key of the table.
  Options write(const S& s) const {
    Options o;
    for (const auto& w : writers_) w(s, o);
    return o;
  }

 private:
  static void read_into(const Options& o, const std::string& k, bool& v) { v = o.flag(k); }
  static void read_into(const Options& o, const std::string& k, int64_t& v) { v = o.integer(k); }
  static void read_into(const Options& o, const std::string& k, double& v) { v = o.number(k); }
  static void read_into(const Options& o, const std::string& k, std::string& v) { v = o.text(k); }
  static void read_into(const Options& o, const std::string& k, std::vector<int64_t>& v) { v = o.integers(k); }

  OptionTable table_;
  std::vector<std::function<void(const Options&, S&)>> readers_;
  std::vector<std::function<void(const S&, Options&)>> writers_;
};

}  // namespace lt
