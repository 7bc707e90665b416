// cli/args.h: the arguments of each subcommand as plain structs, filled by commands.cc from the
// command line and consumed by driver.cc.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/bytes.h"

namespace pt {

struct ModelArgs {
  std::string model;
  int64_t micro_batch = 1;
  std::vector<std::string> dims;  // "name=value"
};

struct InspectArgs {
  ModelArgs model;
  bool nodes = false;  // list every node with its cost
  bool json = false;
};

struct PartitionArgs {
  ModelArgs model;
  int stages = 1;
  int chunks_per_stage = 1;
  std::string strategy = "balanced";
  std::vector<std::string> cut_after;
  std::string memory_limit;  // "8GiB", "512MB", bytes; empty: none
  double slack = 0.02;
  std::string export_dir;
  bool json = false;
};

struct RunArgs {
  std::string model;
  std::vector<std::string> inputs;  // "name=file.npy"
  std::vector<std::string> dims;    // "name=value"
  std::string output_dir;
  int threads = 1;
};

// {"seq=32", "len=7"} -> {{"seq",32},{"len",7}}. Throws UserError naming --dim.
std::map<std::string, int64_t> parse_dims(const std::vector<std::string>& dims);

}  // namespace pt
