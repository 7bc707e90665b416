#include "cli/npy_files.h"

#include "core/error.h"
#include "exec/npy.h"

namespace pt {

std::map<std::string, Tensor> read_named_npy(const std::vector<std::string>& specs) {
  std::map<std::string, Tensor> out;
  for (const std::string& s : specs) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      throw UserError("--input", "cannot read '" + s + "'", "write NAME=FILE.npy");
    out[s.substr(0, eq)] = read_npy(s.substr(eq + 1));
  }
  return out;
}

std::string npy_file_name(const std::string& value_name) {
  std::string s = value_name;
  for (char& c : s)
    if (c == '/' || c == ':' || c == '\\' || c == ' ') c = '_';
  return s + ".npy";
}

}  // namespace pt
