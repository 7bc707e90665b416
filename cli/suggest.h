// cli/suggest.h: what a mistyped command line gets instead of CLI11's bare message. In: the
// parsed-to-be App (its subcommands and their options) and argv. Out: one message naming the
// unknown command or flag, with "did you mean" where a known name is close; and a validator for
// counts (stages, micro-batches, threads) that says so in words.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace pt {

// The known word closest to `word` (edit distance at most a third of its length, at least 2);
// empty when none is that close.
std::string closest_word(const std::string& word, const std::vector<std::string>& known);

// When argv names an unknown subcommand, or a flag its subcommand does not have, the message
// for it ("unknown flag '--stage' for `pipetrain partition`; did you mean '--stages'?");
// otherwise `fallback` (CLI11's own message).
std::string explain_parse_error(CLI::App& app, int argc, char** argv, const std::string& fallback);

// Accepts a whole number >= 1; else "must be a whole number, at least 1; got 'four'".
CLI::Validator at_least_one();

}  // namespace pt
