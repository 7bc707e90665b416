#include "core/files.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace pt {

void write_file_atomic(const std::string& path, std::string_view text, const std::string& todo) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      throw UserError(path, "cannot be written", todo);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw UserError(path, "cannot be written: " + ec.message(), todo);
  }
}

}  // namespace pt
