#include "cli/args.h"

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace pt {

std::map<std::string, int64_t> parse_dims(const std::vector<std::string>& dims) {
  std::map<std::string, int64_t> out;
  for (const std::string& d : dims) {
    const size_t eq = d.find('=');
    int64_t value = -1;
    if (eq != std::string::npos && eq > 0) {
      try {
        size_t used = 0;
        value = std::stoll(d.substr(eq + 1), &used);
        if (used != d.size() - eq - 1) value = -1;
      } catch (const std::exception&) {
        value = -1;
      }
    }
    if (value < 1)
      throw UserError("--dim", "cannot read '" + d + "'", "write NAME=VALUE with VALUE >= 1");
    out[d.substr(0, eq)] = value;
  }
  return out;
}

}  // namespace pt
