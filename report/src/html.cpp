#include "html.h"

#include <cmath>
#include <cstdio>

namespace lt::report::detail {

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string sig(double v, int digits) {
  if (!std::isfinite(v)) return "—";
  char buf[64];
  // Integers-to-be like 20180 read better than 2.018e+04.
  if (std::fabs(v) >= std::pow(10.0, digits) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "—";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string bytes(double v) {
  if (!std::isfinite(v)) return "—";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double x = v;
  while (std::fabs(x) >= 1024.0 && u < 4) {
    x /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", x);
  else std::snprintf(buf, sizeof buf, "%.2f %s", x, units[u]);
  return buf;
}

std::string key_value_table(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string out = "<table class=\"kv\">\n";
  for (const auto& [k, v] : rows) out += "<tr><th>" + escape(k) + "</th><td>" + v + "</td></tr>\n";
  return out + "</table>\n";
}

std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::string out = "<table>\n<tr>";
  for (const auto& h : header) out += "<th>" + escape(h) + "</th>";
  out += "</tr>\n";
  for (const auto& r : rows) {
    out += "<tr>";
    for (const auto& c : r) out += "<td>" + c + "</td>";
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

std::string figure(const std::string& png, const std::string& alt) {
  return "<figure><img src=\"" + escape(png) + "\" alt=\"" + escape(alt) + "\"><figcaption>" + escape(alt) +
         "</figcaption></figure>\n";
}

std::string page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + escape(title) +
         "</title>\n<style>\n"
         "body{font-family:sans-serif;max-width:960px;margin:2em auto;padding:0 1em;color:#222}\n"
         "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}\n"
         "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.2em .6em;"
         "text-align:left;vertical-align:top}\n"
         "td{font-variant-numeric:tabular-nums}table.kv th{background:#f4f4f4;font-weight:normal}\n"
         "figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}figcaption{color:#666;font-size:.9em}\n"
         ".omitted{color:#666;font-style:italic}.warn{color:#a40}\n"
         "</style>\n</head>\n<body>\n<h1>" +
         escape(title) + "</h1>\n" + body + "</body>\n</html>\n";
}

}  // namespace lt::report::detail
