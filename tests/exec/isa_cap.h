// tests/exec/isa_cap.h: PT_MAX_CPU_ISA set by a test that runs each copy of the vector loops
// (exec/cpu/vector_clones.h vector_isa, small_product.cc), and put back as the process had it
// when the test's scope ends: the isa_avx2 ctest entries set it for a whole binary, so the tests
// after such a test still run the AVX2 copies; on_every_copy runs a check once per copy.
// Header-only.
#pragma once

#include <gtest/gtest.h>

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

// fn(isa) once per copy of the vector loops this CPU runs, the widest first: isa "" (the widest),
// "avx2", "sse2" (the baseline), each set as PT_MAX_CPU_ISA and traced in failures; the process's
// own setting put back after.
template <class Fn>
void on_every_copy(Fn fn) {
  const IsaCap cap;
  for (const char* isa : {"", "avx2", "sse2"}) {
    SCOPED_TRACE(*isa ? isa : "the widest copy");
    cap.set(isa);
    fn(std::string(isa));
  }
}

}  // namespace pt::testing
