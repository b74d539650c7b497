#pragma once
// The one-page HTML: escaping, number formatting, and a page with inline CSS only (no
// external resources: a report is read offline, copied around, attached to issues).
#include <string>
#include <utility>
#include <vector>

namespace lt::report::detail {

/// Escapes & < > " ' for text and attribute values.
std::string escape(const std::string& s);

/// `v` with `digits` significant digits ("%.*g"); "—" when non-finite.
std::string sig(double v, int digits = 4);
/// `v` with `decimals` after the point ("%.*f"); "—" when non-finite.
std::string fixed(double v, int decimals);
/// A byte count as the runtime logs it: "1.56 MiB", "303.73 KiB"; "—" when non-finite.
std::string bytes(double v);

/// A two-column table of (label, value) rows; values are HTML already (escape first).
std::string key_value_table(const std::vector<std::pair<std::string, std::string>>& rows);

/// A table with a header row; cells are HTML already.
std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

/// <figure> with the image (relative `png`) and its caption.
std::string figure(const std::string& png, const std::string& alt);

/// The whole document around `body` (HTML already), titled `title` (text).
std::string page(const std::string& title, const std::string& body);

}  // namespace lt::report::detail
