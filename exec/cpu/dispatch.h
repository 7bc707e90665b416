// exec/cpu/dispatch.h: choosing a kernel's element type at creation time. A factory lists the
// C++ types it handles and gets called back with the one matching the spec's dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>

#include "core/ir.h"
#include "exec/kernel.h"

namespace pt::cpu {

template <class... Ts>
struct TypeList {};

// Calls f.template operator()<T>() for the T of the list whose dtype is t; nullptr if none.
template <class... Ts, class F>
std::unique_ptr<Kernel> visit(TypeList<Ts...>, DType t, F&& f) {
  std::unique_ptr<Kernel> k;
  ((t == dtype_of<Ts>() ? (k = f.template operator()<Ts>(), true) : false) || ...);
  return k;
}

}  // namespace pt::cpu
