#include "core/bytes.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace pt {

int64_t parse_bytes(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> units[] = {
      {"", 1},          {"b", 1},          {"kb", 1e3},       {"mb", 1e6},
      {"gb", 1e9},      {"tb", 1e12},      {"kib", 1024.0},   {"mib", 1048576.0},
      {"gib", 1073741824.0}, {"tib", 1099511627776.0}, {"k", 1024.0}, {"m", 1048576.0},
      {"g", 1073741824.0},
  };
  for (const auto& [name, scale] : units) {
    if (pos > 0 && unit == name && value >= 0 && std::isfinite(value))
      return static_cast<int64_t>(std::llround(value * scale));
  }
  throw UserError(flag, "cannot read '" + text + "' as a size",
                  "write bytes, or a number with KB, MB, GB, KiB, MiB or GiB");
}

std::string format_bytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 0) return "-" + format_bytes(-std::max(bytes, -std::numeric_limits<int64_t>::max()));
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 6) {
    v /= 1024;
    ++unit;
  }
  const int decimals = v < 9.995 ? 2 : v < 99.95 ? 1 : 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, kUnits[unit]);
  return buf;
}

}  // namespace pt
