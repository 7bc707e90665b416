// core/tensor_fetch.h: a tensor's bytes by name, brought when a writer of trained weights asks for
// them (onnx_import/export.h, onnx_import/state_dict.h); across processes one held by another
// rank comes from there (train/trainer.h), so that rank 0 holds one such tensor at a time.
#pragma once

#include <functional>
#include <string>

#include "core/ir.h"

namespace pt {

// The tensor returned holds its bytes and stays valid until the next call.
using TensorFetch = std::function<const Tensor&(const std::string& name)>;

}  // namespace pt
