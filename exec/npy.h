// exec/npy.h: NumPy .npy files <-> Tensor (format version 1.0/2.0, little-endian, C order).
// How tensors enter and leave `pipetrain run` and the data loaders.
#pragma once

#include <string>

#include "core/ir.h"

namespace pt {

// Throws UserError naming the file: missing, not .npy, Fortran order, big-endian, an unknown
// dtype, or fewer bytes than the header promises.
Tensor read_npy(const std::string& path);
// The type alone, from the header, with the same checks (the data is not read).
TensorType read_npy_type(const std::string& path);
// Writes atomically (temporary file renamed into place).
void write_npy(const Tensor& t, const std::string& path);

}  // namespace pt
