// Text helpers shared by the reports: escaping for JSON strings and XML/SVG text, and 1,234,567 numbers.
#pragma once
#include <string>
#include <string_view>

namespace mp {

std::string json_escape(std::string_view s);  // the inside of a JSON string literal (no quotes added)
std::string xml_escape(std::string_view s);   // text or attribute content for XML / SVG
std::string thousands(long long n);           // 42255 -> "42,255", -1234 -> "-1,234"

}  // namespace mp
