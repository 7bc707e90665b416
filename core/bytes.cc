#include "core/bytes.h"

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

}  // namespace pt
