// Fuzz target: a schedule CSV, as `schedule --from-csv` and the config's `pipeline.schedule: FILE`
// take it: parsed, validated, then simulated with unit costs.
#include "schedule/costs.h"
#include "schedule/schedule.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string where = "fuzz.csv";
  pt::fuzz::accepted(where, [&] {
    const pt::Schedule s = pt::parse_csv(std::string(reinterpret_cast<const char*>(data), size), where);
    pt::validate(s, where);
    pt::simulate(s, pt::unit_costs(s.stages, s.chunks), where);
  });
  return 0;
}
