// cli/commands.h: the subcommand table. Parses argv with CLI11 into the structs of args.h and
// calls the driver. Returns the exit code: 0 success, 2 bad input (printed as one line).
#pragma once

namespace pt {

int run_cli(int argc, char** argv);

}  // namespace pt
