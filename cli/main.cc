// pipetrain's entry point: everything happens in the subcommand table (cli/commands.cc).
#include "cli/commands.h"

int main(int argc, char** argv) { return pt::run_cli(argc, argv); }
