// cli/npy_files.h: arrays in and out of the commands that read or write .npy (`run`, `grad`).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

// "NAME=FILE.npy" per entry -> name -> array. UserError naming --input on a malformed entry.
std::map<std::string, Tensor> read_named_npy(const std::vector<std::string>& specs);

// A value's name as a file name: '/', ':', '\' and ' ' become '_', then ".npy".
std::string npy_file_name(const std::string& value_name);

}  // namespace pt
