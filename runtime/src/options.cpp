// Component options: resolution against a table, rules, and the Markdown the docs hold.
#include "leantrain/runtime/options.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "leantrain/runtime/errors.h"

namespace lt {

std::string option_type_name(const OptionValue& v) {
  switch (v.index()) {
    case 0: return "true or false";
    case 1: return "an integer";
    case 2: return "a number";
    case 3: return "a string";
    default: return "an array of integers";
  }
}

std::string option_literal(const OptionValue& v) {
  std::ostringstream s;
  if (auto* b = std::get_if<bool>(&v)) {
    s << (*b ? "true" : "false");
  } else if (auto* i = std::get_if<int64_t>(&v)) {
    s << *i;
  } else if (auto* d = std::get_if<double>(&v)) {
    s << *d;
    if (std::isfinite(*d) && s.str().find_first_of(".e") == std::string::npos) s << ".0";
  } else if (auto* t = std::get_if<std::string>(&v)) {
    s << '"' << *t << '"';
  } else {
    const auto& a = std::get<std::vector<int64_t>>(v);
    s << '[';
    for (size_t k = 0; k < a.size(); ++k) s << (k ? ", " : "") << a[k];
    s << ']';
  }
  return s.str();
}

namespace rules {

OptionRule at_least(int64_t min) {
  return {">= " + std::to_string(min), [min](const OptionValue& v) -> std::string {
            const std::string need = "must be >= " + std::to_string(min);
            if (auto* i = std::get_if<int64_t>(&v)) return *i >= min ? "" : need;
            if (auto* a = std::get_if<std::vector<int64_t>>(&v))
              for (size_t k = 0; k < a->size(); ++k)
                if ((*a)[k] < min) return "every entry " + need + " (entry " + std::to_string(k) + ")";
            return "";
          }};
}

OptionRule in_range(double lo, bool lo_closed, double hi, bool hi_closed) {
  std::ostringstream t;
  t << "in " << (lo_closed ? '[' : '(') << lo << ", " << hi << (hi_closed ? ']' : ')');
  const std::string text = t.str();
  return {text, [=](const OptionValue& v) -> std::string {
            const double x = std::get<double>(v);
            const bool ok = (lo_closed ? x >= lo : x > lo) && (hi_closed ? x <= hi : x < hi);
            return ok ? "" : "must be " + text;
          }};
}

OptionRule one_of(std::vector<std::string> allowed) {
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : " | ") + a;
  return {list, [allowed, list](const OptionValue& v) -> std::string {
            const auto& s = std::get<std::string>(v);
            for (const auto& a : allowed)
              if (s == a) return "";
            return "allowed: " + list;
          }};
}

}  // namespace rules

const OptionValue* Options::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

namespace {

template <class T>
const T& typed(const Options& o, const std::string& key) {
  const OptionValue* v = o.find(key);
  if (!v) throw std::logic_error("option '" + key + "' is not set (resolve the options against their table first)");
  const T* t = std::get_if<T>(v);
  if (!t) throw std::logic_error("option '" + key + "' holds " + option_type_name(*v) + ", read as another type");
  return *t;
}

// The given value converted to the type of `spec`, or nullopt-like false when it cannot be.
bool convert(const OptionValue& given, const OptionValue& like, OptionValue& out) {
  if (given.index() == like.index()) {
    out = given;
    return true;
  }
  if (std::holds_alternative<double>(like) && std::holds_alternative<int64_t>(given)) {
    out = static_cast<double>(std::get<int64_t>(given));
    return true;
  }
  return false;
}

}  // namespace

bool Options::flag(const std::string& key) const { return typed<bool>(*this, key); }
int64_t Options::integer(const std::string& key) const { return typed<int64_t>(*this, key); }
double Options::number(const std::string& key) const { return typed<double>(*this, key); }
const std::string& Options::text(const std::string& key) const { return typed<std::string>(*this, key); }
const std::vector<int64_t>& Options::integers(const std::string& key) const {
  return typed<std::vector<int64_t>>(*this, key);
}

Options resolve_options(const std::string& section, const std::string& kind, const OptionTable& table,
                        const Options& given) {
  auto spec_of = [&](const std::string& key) -> const OptionSpec* {
    for (const auto& s : table)
      if (s.key == key) return &s;
    return nullptr;
  };
  for (const auto& [key, value] : given.values()) {
    if (spec_of(key)) continue;
    std::string keys;
    for (const auto& s : table) keys += (keys.empty() ? "" : ", ") + s.key;
    throw ConfigError("unknown key " + section + "." + key + " for " + section + ".kind = \"" + kind + "\"; its keys: " +
                      (keys.empty() ? "none" : keys) + " (`leantrain options` lists every kind's)");
  }
  Options out;
  for (const auto& spec : table) {
    const std::string name = section + "." + spec.key;
    OptionValue v = spec.default_value;
    if (const OptionValue* g = given.find(spec.key)) {
      if (!convert(*g, spec.default_value, v))
        throw ConfigError(name + ": expected " + option_type_name(spec.default_value) + ", got " +
                          option_type_name(*g) + " (" + option_literal(*g) + ")");
    }
    if (spec.rule.check) {
      const std::string why = spec.rule.check(v);
      if (!why.empty()) throw ConfigError(name + " = " + option_literal(v) + ": " + why);
    }
    out.set(spec.key, std::move(v));
  }
  return out;
}

Options without_other_kinds_keys(const std::string& section, const OptionTable& own,
                                 const std::vector<std::pair<std::string, const OptionTable*>>& others,
                                 const Options& given, std::vector<std::string>* dropped) {
  auto has = [](const OptionTable& t, const std::string& key) {
    for (const auto& s : t)
      if (s.key == key) return true;
    return false;
  };
  Options out;
  for (const auto& [key, value] : given.values()) {
    std::string owner;
    if (!has(own, key))
      for (const auto& [kind, table] : others)
        if (has(*table, key)) {
          owner = kind;
          break;
        }
    if (owner.empty()) {
      out.set(key, value);
    } else if (dropped) {
      dropped->push_back(section + "." + key + " (an option of kind " + owner + ")");
    }
  }
  return out;
}

std::string options_markdown(const std::string& section, const std::string& kind, const std::string& doc,
                             const OptionTable& table) {
  std::ostringstream md;
  md << "### [" << section << "] kind = \"" << kind << "\"\n\n" << doc << "\n\n";
  if (table.empty()) return md.str() + "No options.\n";
  md << "| key | type | default | rule | meaning |\n|---|---|---|---|---|\n";
  for (const auto& s : table) {
    md << "| `" << s.key << "` | " << option_type_name(s.default_value) << " | `" << option_literal(s.default_value)
       << "` | " << (s.rule.text.empty() ? "" : s.rule.text) << " | " << s.doc << " |\n";
  }
  return md.str();
}

}  // namespace lt
