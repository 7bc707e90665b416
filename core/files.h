// core/files.h: writing a whole file so that no reader ever sees half of it.
#pragma once

#include <string>
#include <string_view>

namespace pt {

// Writes `text` to `path` through a temporary file renamed into place. On failure nothing is left
// behind and a UserError names the path, ending with `todo` (e.g. "choose another --csv").
void write_file_atomic(const std::string& path, std::string_view text, const std::string& todo);

}  // namespace pt
