#include "tests/exec/node_case.h"

#include <gtest/gtest.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"

namespace pt::testing {
namespace {

namespace fs = std::filesystem;

// Inputs each op reads while its kernel is made (in a real model they are folded constants).
const std::map<std::string, std::set<int>>& compile_time_inputs() {
  static const std::map<std::string, std::set<int>> m = {
      {"Reshape", {1}},   {"Expand", {1}},         {"Squeeze", {1}},    {"Unsqueeze", {1}},
      {"Slice", {1, 2, 3, 4}}, {"Split", {1}},     {"ReduceSum", {1}},  {"ReduceMean", {1}},
      {"Pad", {1, 2, 3}}, {"CumSum", {1}},
      {"Dropout", {1, 2}}, {"Clip", {1, 2}},
  };
  return m;
}

template <class Proto>
bool read_proto(const fs::path& p, Proto* out) {
  std::ifstream in(p, std::ios::binary);
  return in && out->ParseFromIstream(&in);
}

}  // namespace

std::string node_test_root() {
  const char* env = std::getenv("PT_NODE_TEST_ROOT");
  return env && *env ? env : kNodeTestRoot;
}

namespace {

NodeCaseResult skip(const std::string& why) { return {NodeCaseResult::kSkipped, why}; }
NodeCaseResult fail(const std::string& why) { return {NodeCaseResult::kFailed, why}; }

// Raises the model's opset to 17 when the op's schema is the same there; false otherwise.
bool raise_opset(onnx::ModelProto* m) {
  const int64_t opset = default_opset(*m);
  if (opset >= kMinOpset) return true;
  const auto& node = m->graph().node(0);
  const auto* schema = onnx::OpSchemaRegistry::Schema(node.op_type(), 17, node.domain());
  if (!schema || schema->since_version() > opset) return false;
  for (auto& o : *m->mutable_opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") o.set_version(17);
  return true;
}

std::string compare(const Tensor& want, const void* have_data, const TensorType& have_type,
                    const std::string& name) {
  if (!(want.type == have_type))
    return name + ": type " + have_type.str() + ", expected " + want.type.str();
  const int64_t n = want.type.numel();
  if (want.type.dtype == DType::kFloat32) {
    const float* w = want.as<float>();
    const float* h = static_cast<const float*>(have_data);
    for (int64_t i = 0; i < n; ++i) {
      const bool same = (std::isnan(w[i]) && std::isnan(h[i])) || h[i] == w[i];  // NaN, infinities
      if (!same && !(std::fabs(h[i] - w[i]) <= 1e-6 + 1e-4 * std::fabs(w[i]))) {
        std::ostringstream s;
        s << name << "[" << i << "] = " << h[i] << ", expected " << w[i];
        return s.str();
      }
    }
    return "";
  }
  // An empty tensor's data may be a null pointer, which memcmp must not be given even for 0 bytes.
  if (!want.data.empty() && std::memcmp(want.data.data(), have_data, want.data.size()) != 0)
    return name + ": values differ";
  return "";
}

}  // namespace

std::vector<std::string> node_cases(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(node_test_root(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void PrintTo(const NodeCase& c, std::ostream* os) { *os << c.name; }

std::vector<NodeCase> op_cases(const std::string& prefix, KernelFactory factory,
                               const std::vector<std::string>& excluded) {
  std::vector<NodeCase> out;
  for (const std::string& name : node_cases(prefix)) {
    bool keep = (name == prefix || name.rfind(prefix + "_", 0) == 0) &&
                name.find("_expanded") == std::string::npos;
    for (const std::string& e : excluded) keep = keep && name.find(e) == std::string::npos;
    if (keep) out.push_back({name, factory});
  }
  return out;
}

int count_passed(const std::vector<NodeCase>& cases) {
  int passed = 0;
  for (const NodeCase& c : cases)
    passed += run_node_case(c.name, c.factory).kind == NodeCaseResult::kPassed;
  return passed;
}

NodeCaseResult run_node_case(const std::string& case_name, KernelFactory factory) {
  const fs::path dir = fs::path(node_test_root()) / case_name;
  onnx::ModelProto m;
  if (!read_proto(dir / "model.onnx", &m)) return fail("cannot read model.onnx");
  if (m.graph().node_size() != 1) return skip("not a single-node case");
  const auto& proto_node = m.graph().node(0);
  if (!raise_opset(&m)) return skip("opset " + std::to_string(default_opset(m)) + " form of the op");

  // Reference data, by tensor name.
  std::map<std::string, Tensor> data;
  for (const auto& io : m.graph().input())
    if (!io.type().has_tensor_type()) return skip("input '" + io.name() + "' is not a tensor");
  for (const auto& io : m.graph().output())
    if (!io.type().has_tensor_type()) return skip("output '" + io.name() + "' is not a tensor");
  for (int i = 0; i < m.graph().input_size(); ++i) {
    onnx::TensorProto t;
    if (!read_proto(dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb"), &t))
      return skip("input " + std::to_string(i) + " is not a tensor");
    try {
      data[m.graph().input(i).name()] = tensor_from_proto(t, case_name);
    } catch (const UserError& e) {
      return skip(std::string("input ") + std::to_string(i) + ": " + e.what());
    }
  }
  // Compile-time inputs become initializers.
  const auto ct = compile_time_inputs().find(proto_node.op_type());
  if (ct != compile_time_inputs().end()) {
    google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> kept;
    for (const auto& in : m.graph().input()) {
      int index = -1;
      for (int k = 0; k < proto_node.input_size(); ++k)
        if (proto_node.input(k) == in.name()) index = k;
      if (index >= 0 && ct->second.count(index)) {
        tensor_to_proto(data.at(in.name()), in.name(), m.mutable_graph()->add_initializer());
      } else {
        *kept.Add() = in;
      }
    }
    m.mutable_graph()->mutable_input()->Swap(&kept);
  }
  // One file per process: the conformance runners and the kernel tests run cases in parallel.
  const fs::path tmp =
      fs::temp_directory_path() / ("pt_node_case_" + case_name + "_" + std::to_string(getpid()) + ".onnx");
  save_model(m, tmp.string());
  Graph g;
  try {
    g = import_model(tmp.string());
  } catch (const UserError& e) {
    fs::remove(tmp);
    return skip(std::string("import refuses it: ") + e.what());
  }
  fs::remove(tmp);
  if (g.nodes.size() != 1) return skip("folded away at import");
  const Node& node = g.nodes[0];

  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  CpuContext ctx{&engine, &stream, 2};
  KernelSpec spec{g, node, {}, {}, &ctx};
  for (ValueId v : node.inputs) spec.inputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
  for (ValueId v : node.outputs) spec.outputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
  // Ops the table runs only after a rewrite (Bernoulli: autodiff/training_mode.h) have none.
  if (!factory) return skip("no CPU kernel: the op runs only in its rewritten form");
  std::unique_ptr<Kernel> kernel = factory(spec);
  if (!kernel) return skip("the kernel declines this dtype or attribute combination");

  std::vector<Buffer> ins, outs;
  std::vector<std::vector<std::byte>> out_storage(node.outputs.size());
  for (ValueId v : node.inputs) {
    if (v == kNoValue) {
      ins.push_back({});
      continue;
    }
    const Value& val = g.value(v);
    const Tensor* t = val.init ? val.init.get() : &data.at(val.name);
    ins.push_back({const_cast<std::byte*>(t->data.data()), &val.type});
  }
  for (size_t k = 0; k < node.outputs.size(); ++k) {
    if (node.outputs[k] == kNoValue) {
      outs.push_back({});
      continue;
    }
    const Value& val = g.value(node.outputs[k]);
    out_storage[k].assign(static_cast<size_t>(val.type.bytes()), std::byte{0xAB});
    outs.push_back({out_storage[k].data(), &val.type});
  }
  std::vector<std::byte> scratch(kernel->scratch_bytes());
  kernel->run(ins, outs, scratch.data());
  stream.wait();

  for (int k = 0; k < m.graph().output_size(); ++k) {
    onnx::TensorProto t;
    if (!read_proto(dir / "test_data_set_0" / ("output_" + std::to_string(k) + ".pb"), &t))
      return fail("cannot read output " + std::to_string(k));
    Tensor want;
    try {
      want = tensor_from_proto(t, case_name);
    } catch (const UserError& e) {
      return skip(std::string("output ") + std::to_string(k) + ": " + e.what());
    }
    const std::string& name = m.graph().output(k).name();
    size_t slot = 0;
    while (slot < node.outputs.size() &&
           (node.outputs[slot] == kNoValue || g.value(node.outputs[slot]).name != name))
      ++slot;
    if (slot == node.outputs.size()) return fail("output " + name + " not produced");
    const std::string diff = compare(want, out_storage[slot].data(), *outs[slot].type, name);
    if (!diff.empty()) return fail(diff);
  }
  return {NodeCaseResult::kPassed, ""};
}

std::vector<float> wave(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = std::sin(0.37f * i) * scale;
  return v;
}

void expect_near_all(const std::vector<float>& have, const std::vector<float>& want) {
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(have[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i])) << "at " << i;
}

}  // namespace pt::testing
