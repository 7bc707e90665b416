// core/bytes.h: sizes as users write them ("8GiB", "512MB", "1.5e9"), for memory limits and
// recompute budgets alike, and as every report prints them.
#pragma once

#include <cstdint>
#include <string>

namespace pt {

// "8GiB" -> 8589934592; "1.5e9" -> 1500000000. Throws UserError naming `where`.
int64_t parse_bytes(const std::string& text, const std::string& where);

// Binary units, three significant digits: "512 B", "3.00 KiB", "12.5 MiB", "1.37 GiB".
std::string format_bytes(int64_t bytes);

}  // namespace pt
