#include "schedule/schedule.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <sstream>

#include "core/error.h"

namespace pt {

const char* placement_name(Placement p) { return p == Placement::kV ? "v" : "loop"; }

int device_of(Placement placement, int stages, int chunk) {
  const int round = chunk / stages, pos = chunk % stages;
  if (placement == Placement::kV && round % 2 == 1) return stages - 1 - pos;
  return pos;
}

bool Schedule::lowered() const {
  for (const auto& list : devices)
    for (const Action& a : list)
      if (is_comm(a.op)) return true;
  return false;
}

size_t Schedule::action_count() const {
  size_t n = 0;
  for (const auto& list : devices) n += list.size();
  return n;
}

std::string format_csv(const Schedule& s) {
  std::ostringstream out;
  out << "# pipetrain schedule\n"
      << "# kind: " << s.kind << "\n# stages: " << s.stages << "\n# chunks: " << s.chunks
      << "\n# micro_batches: " << s.micro_batches
      << "\n# placement: " << placement_name(s.placement) << "\n";
  for (const auto& list : s.devices) {
    for (size_t i = 0; i < list.size(); ++i) out << (i ? "," : "") << format_action(list[i]);
    out << "\n";
  }
  return out.str();
}

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

int header_number(const std::string& value, const std::string& where, const std::string& key) {
  int n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < 1)
    throw UserError(where, key + " is '" + value + "', not a positive whole number",
                    "write e.g. '# " + key + ": 4'");
  return n;
}

struct Header {
  std::map<std::string, std::string> fields;  // key -> value, with the line it came from
  std::map<std::string, int> line;
};

// `# key: value` for the known keys; anything else after '#' is a comment.
void read_header_line(const std::string& body, int line, Header* h) {
  static const char* kKeys[] = {"kind", "stages", "chunks", "micro_batches", "placement"};
  const size_t colon = body.find(':');
  if (colon == std::string::npos) return;
  const std::string key = trim(body.substr(0, colon));
  for (const char* k : kKeys)
    if (key == k) {
      h->fields[key] = trim(body.substr(colon + 1));
      h->line[key] = line;
    }
}

// Every chunk and every micro-batch needs at least one action, so a schedule whose chunks (all
// stages together) or micro-batches, as the header says or the highest action numbers imply,
// outnumber the actions in the file is refused here, before anything is sized by those numbers:
// absurd ones end in this line, not in a hang. Smaller gaps are left to validate, which draws
// the grid.
void check_numbers_fit_actions(const Schedule& s, int64_t chunks, int64_t mbs, const std::string& where) {
  int64_t actions = 0;
  for (const auto& list : s.devices) actions += static_cast<int64_t>(list.size());
  if (int64_t{s.stages} * chunks <= actions && mbs <= actions) return;
  throw UserError(where,
                  "asks for " + std::to_string(s.stages) + " stages x " + std::to_string(chunks) +
                      " chunks and " + std::to_string(mbs) + " micro-batches, but holds only " +
                      std::to_string(actions) + " actions",
                  "check the header's chunks and micro_batches and the numbers in the actions");
}

// Applies the header to `s`, inferring what it leaves out from the actions.
void apply_header(const Header& h, const std::string& where, Schedule* s) {
  auto at = [&](const std::string& key) { return where + ":" + std::to_string(h.line.at(key)); };
  int max_chunk = 0, max_mb = 0;
  for (const auto& list : s->devices)
    for (const Action& a : list) {
      max_chunk = std::max(max_chunk, a.chunk);
      max_mb = std::max(max_mb, a.micro_batch);
    }
  s->stages = static_cast<int>(s->devices.size());
  if (h.fields.count("kind")) s->kind = h.fields.at("kind");
  if (h.fields.count("stages")) {
    const int p = header_number(h.fields.at("stages"), at("stages"), "stages");
    if (p != s->stages)
      throw UserError(at("stages"), "says " + std::to_string(p) + " stages but the file has " +
                                        std::to_string(s->stages) + " device rows",
                      "write one row per device");
  }
  if (h.fields.count("placement")) {
    const std::string& v = h.fields.at("placement");
    if (v != "loop" && v != "v")
      throw UserError(at("placement"), "placement '" + v + "' is not known", "use loop or v");
    s->placement = v == "v" ? Placement::kV : Placement::kLoop;
  }
  const int64_t chunks = h.fields.count("chunks") ? header_number(h.fields.at("chunks"), at("chunks"), "chunks")
                                                  : int64_t{max_chunk} / std::max(1, s->stages) + 1;
  const int64_t mbs = h.fields.count("micro_batches")
                          ? header_number(h.fields.at("micro_batches"), at("micro_batches"), "micro_batches")
                          : int64_t{max_mb} + 1;
  check_numbers_fit_actions(*s, chunks, mbs, where);
  s->chunks = static_cast<int>(chunks);
  s->micro_batches = static_cast<int>(mbs);
}

}  // namespace

Schedule parse_csv(const std::string& text, const std::string& where) {
  Schedule s;
  Header header;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string t = trim(line);
    if (t.empty()) continue;
    if (t[0] == '#') {
      read_header_line(t.substr(1), number, &header);
      continue;
    }
    std::vector<Action> row;
    std::istringstream cells(t);
    std::string cell;
    for (int column = 1; std::getline(cells, cell, ','); ++column) {
      const std::string c = trim(cell);
      std::optional<Action> a = parse_action(c);
      if (!a)
        throw UserError(where + ":" + std::to_string(number),
                        "cell " + std::to_string(column) + " ('" + c + "') is not an action",
                        "write actions like 0F3, 1B2, 1W2, 0BW3, 1SF4, 1RB4 or STEP");
      row.push_back(*a);
    }
    if (!t.empty() && t.back() == ',')
      throw UserError(where + ":" + std::to_string(number), "the row ends with an empty cell",
                      "remove the trailing comma");
    s.devices.push_back(std::move(row));
  }
  if (s.devices.empty())
    throw UserError(where, "holds no device rows", "write one row of actions per device");
  apply_header(header, where, &s);
  return s;
}

}  // namespace pt
