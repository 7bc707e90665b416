// Runs every ONNX backend node test (libonnx-testdata, data/node/*) whose op pipetrain runs on
// the CPU backend, and prints one line per case and the closing 'N passed, M failed'. Cases of
// ops outside the op table, or which import or the kernel decline, are listed as skipped with
// the reason. With a file argument, the committed list of the cases that pass: a case on it
// that no longer passes (a kernel that starts declining it, say) fails too, and a case that passes
// off the list is named so that the list can grow. Exit status 1 when any case fails.
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "exec/cpu/cpu_backend.h"
#include "onnx_import/op_table.h"
#include "tests/exec/node_case.h"

namespace {

std::string op_key_of(const std::string& case_name) {
  onnx::ModelProto m;
  std::ifstream in(pt::testing::node_test_root() + "/" + case_name + "/model.onnx",
                   std::ios::binary);
  if (!in || !m.ParseFromIstream(&in) || m.graph().node_size() != 1) return "";
  const auto& n = m.graph().node(0);
  const pt::OpEntry* e = pt::find_op(n.domain(), n.op_type());
  if (!e || e->support != pt::OpSupport::kRun) return "";
  return n.domain().empty() ? n.op_type() : n.domain() + "::" + n.op_type();
}

}  // namespace

std::set<std::string> expected_passes(const char* path) {
  std::set<std::string> names;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "node_conformance: cannot read the list %s\n", path);
    std::exit(2);
  }
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') names.insert(line);
  return names;
}

int main(int argc, char** argv) {
  const bool listed = argc > 1;
  const std::set<std::string> expected = listed ? expected_passes(argv[1]) : std::set<std::string>{};
  std::set<std::string> passing;
  int passed = 0, failed = 0, skipped = 0;
  std::map<std::string, int> outside_table;
  for (const std::string& name : pt::testing::node_cases("test_")) {
    const std::string key = op_key_of(name);
    if (key.empty()) {
      ++outside_table[name.substr(0, name.find('_', 5))];
      continue;
    }
    const pt::testing::NodeCaseResult r =
        pt::testing::run_node_case(name, pt::cpu_kernel_factory(key));
    switch (r.kind) {
      case pt::testing::NodeCaseResult::kPassed: ++passed; passing.insert(name); std::printf("ok      %s\n", name.c_str()); break;
      case pt::testing::NodeCaseResult::kFailed: ++failed; std::printf("FAILED  %s: %s\n", name.c_str(), r.message.c_str()); break;
      case pt::testing::NodeCaseResult::kSkipped: ++skipped; std::printf("skipped %s: %s\n", name.c_str(), r.message.c_str()); break;
    }
  }
  int outside = 0;
  for (const auto& [prefix, count] : outside_table) outside += count;
  std::printf("%d cases of ops outside the op table, or of several nodes, not run\n", outside);
  std::printf("%d skipped\n", skipped);
  for (const std::string& name : expected)
    if (!passing.count(name)) {
      ++failed;
      std::printf("DROPPED %s: on the list of passing cases, and no longer passes\n", name.c_str());
    }
  if (listed)
    for (const std::string& name : passing)
      if (!expected.count(name)) std::printf("new     %s: passes, and is not on the list yet\n", name.c_str());
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
