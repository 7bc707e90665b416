#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace pt {

void internal_failure(const char* file, int line, const char* cond, const std::string& message) {
  std::fprintf(stderr, "pipetrain internal error at %s:%d: check '%s' failed%s%s\n", file, line,
               cond, message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace pt
