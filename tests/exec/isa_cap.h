// tests/exec/isa_cap.h: PT_MAX_CPU_ISA set by a test that runs each copy of the vector loops
// (exec/cpu/vector_clones.h vector_isa, small_product.cc), and put back as the process had it
// when the test's scope ends: the isa_avx2 ctest entries set it for a whole binary, so the tests
// after such a test still run the AVX2 copies. Header-only.
#pragma once

#include <cstdlib>
#include <string>

namespace pt::testing {

class IsaCap {
 public:
  IsaCap() : had_(std::getenv(kName) != nullptr), was_(had_ ? std::getenv(kName) : "") {}
  ~IsaCap() {
    if (had_) setenv(kName, was_.c_str(), 1);
    else unsetenv(kName);
  }
  IsaCap(const IsaCap&) = delete;
  IsaCap& operator=(const IsaCap&) = delete;

  // "" for the widest copy this CPU runs, "avx2" or "sse2" for a narrower one.
  void set(const char* isa) const { setenv(kName, isa, 1); }

 private:
  static constexpr const char* kName = "PT_MAX_CPU_ISA";
  bool had_;
  std::string was_;
};

}  // namespace pt::testing
