// tests/exec/counting_backend.h: a CPU backend that fuses nothing and records the bytes of every
// allocation it hands out, for the tests that hold a program's or a device's arena to its plan.
// Header-only.
#pragma once

#include <vector>

#include "exec/cpu/cpu_backend.h"

namespace pt::testing {

class CountingBackend : public CpuBackend {
 public:
  CountingBackend() : CpuBackend(1, Fusion::kNone) {}
  void* allocate(size_t bytes) override {
    allocated.push_back(bytes);
    return CpuBackend::allocate(bytes);
  }
  std::vector<size_t> allocated;
};

}  // namespace pt::testing
