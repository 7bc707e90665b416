#include "cli/suggest.h"

#include <algorithm>
#include <cctype>

namespace pt {
namespace {

// Levenshtein distance, case-insensitive.
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// A word that is a value, not a flag: "-100", "-1e-3".
bool is_number(const std::string& w) {
  return w.size() > 1 && (std::isdigit(static_cast<unsigned char>(w[1])) || w[1] == '.');
}

std::vector<std::string> flag_names(const CLI::App& sub) {
  std::vector<std::string> names = {"--help", "-h"};
  for (const CLI::Option* o : sub.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : o->get_snames()) names.push_back("-" + n);
  }
  return names;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& known) {
  const std::string best = word.size() > 3 ? closest_word(word, known) : "";  // not for -x
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

}  // namespace

std::string closest_word(const std::string& word, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& k : known) {
    const size_t d = distance(word, k);
    if (d < best_d) {
      best = k;
      best_d = d;
    }
  }
  return best;
}

std::string explain_parse_error(CLI::App& app, int argc, char** argv, const std::string& fallback) {
  std::vector<std::string> commands;
  std::string list;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands.push_back(s->get_name());
    list += (list.empty() ? "" : ", ") + s->get_name();
  }
  if (argc < 2) return "name a command: " + list;
  const std::string first = argv[1];
  if (first[0] != '-' && std::find(commands.begin(), commands.end(), first) == commands.end()) {
    const std::string hint = did_you_mean(first, commands);
    return "unknown command '" + first + "'" + (hint.empty() ? "; the commands are " + list : hint);
  }
  if (first[0] == '-') return fallback;
  CLI::App* sub = app.get_subcommand(first);
  const std::vector<std::string> known = flag_names(*sub);
  for (int i = 2; i < argc; ++i) {
    std::string w = argv[i];
    if (w == "--") break;
    if (w.size() < 2 || w[0] != '-' || is_number(w)) continue;
    w = w.substr(0, w.find('='));
    if (std::find(known.begin(), known.end(), w) != known.end()) continue;
    std::string hint = did_you_mean(w, known);
    if (hint.empty() && first == "train" && w.rfind("--", 0) == 0)
      hint = "; config keys are set with --set KEY=VALUE (--set " + w.substr(2) + "=...)";
    return "unknown flag '" + w + "' for `pipetrain " + first + "`" + hint;
  }
  // CLI11's "A excludes B": two flags that cannot be given together; --plan gives what the other sets.
  const std::string excludes = " excludes ";
  if (const size_t at = fallback.find(excludes); at != std::string::npos) {
    const std::string a = fallback.substr(0, at), b = fallback.substr(at + excludes.size());
    if (a == "--plan" || b == "--plan") {
      const std::string other = a == "--plan" ? b : a;
      const std::string named = other[0] == '-' ? other : "the " + other + " argument";
      return other + ": the plan (--plan FILE) sets it; leave out " + named;
    }
    return a + " and " + b + " cannot be given together; give one of them";
  }
  return fallback;
}

CLI::Validator at_least_one() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size() || v < 1) return "must be a whole number, at least 1; got '" + s + "'";
        return "";
      },
      "N >= 1");
}

}  // namespace pt
