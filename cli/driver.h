// cli/driver.h: the one place that spells the chain out (import -> cost -> partition -> ...).
// Each subcommand runs the chain up to its link and prints what that link made. Returns the
// process exit code; UserErrors propagate to main, which prints them as one line.
#pragma once

#include "cli/args.h"

namespace pt {

int run_ops();
int run_inspect(const InspectArgs& a);
int run_partition(const PartitionArgs& a);
int run_forward(const RunArgs& a);

}  // namespace pt
