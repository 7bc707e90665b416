// tests/onnx_import/draw_rewrite_test.cc: the import rewrite of what training-mode exports write
// for stochastic depth (onnx_import/random_rewrite.h): RandomUniformLike compared with a constant
// and cast to float becomes Bernoulli(P) with P the chance the comparison holds, for every
// comparison op and operand order, with low/high, Cast or CastLike; anything else is one line
// naming the node. Dropout's ratio and training_mode computed by small subgraphs
// (optimize=False) fold to initializers.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "onnx_import/export.h"
#include "onnx_import/import.h"

namespace pt {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "pt_draw_rewrite_test";
  fs::create_directories(dir);
  return dir / name;
}

void set_type(onnx::ValueInfoProto* vi, const std::string& name, int elem,
              const std::vector<int64_t>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  tt->mutable_shape();  // a scalar has a shape with no dims
  for (int64_t d : dims) {
    if (d < 0)
      tt->mutable_shape()->add_dim()->set_dim_param("batch");
    else
      tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& name, const std::string& op,
                          const std::vector<std::string>& in, const std::vector<std::string>& out) {
  auto* n = g->add_node();
  n->set_name(name);
  n->set_op_type(op);
  for (const auto& i : in) n->add_input(i);
  for (const auto& o : out) n->add_output(o);
  return n;
}

void add_float_attr(onnx::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}

void add_int_attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void add_scalar(onnx::GraphProto* g, const std::string& name, float v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_float_data(v);
}

onnx::ModelProto model(int64_t opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  m.mutable_graph()->set_name("draws");
  return m;
}

// x [batch, 4] -> y = x * Cast(cmp(RandomUniformLike(x), p)) / survival, the stochastic-depth
// form, with the comparison op and operand order given.
onnx::ModelProto draw_model(const std::string& cmp, bool r_left, float p, float low, float high,
                            bool cast_like) {
  onnx::ModelProto m = model();
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {-1, 4});
  set_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, 4});
  add_scalar(g, "p", p);
  auto* r = add_node(g, "draw", "RandomUniformLike", {"x"}, {"r"});
  add_float_attr(r, "low", low);
  add_float_attr(r, "high", high);
  add_node(g, "cmp", cmp, r_left ? std::vector<std::string>{"r", "p"} : std::vector<std::string>{"p", "r"},
           {"b"});
  if (cast_like) {
    add_node(g, "cast", "CastLike", {"b", "x"}, {"mask"});
  } else {
    add_int_attr(add_node(g, "cast", "Cast", {"b"}, {"mask"}), "to", onnx::TensorProto::FLOAT);
  }
  add_node(g, "mul", "Mul", {"x", "mask"}, {"y"});
  return m;
}

Graph import_saved(const onnx::ModelProto& m, const std::string& name, int64_t batch = 3) {
  const fs::path p = scratch(name);
  save_model(m, p.string());
  ImportOptions o;
  o.batch = batch;
  return import_model(p.string(), o);
}

std::string import_error(const onnx::ModelProto& m, const std::string& name) {
  try {
    import_saved(m, name);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

const Node* find_node(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes)
    if (n.op_type == op) return &n;
  return nullptr;
}

TEST(RandomRewrite, EveryComparisonBecomesBernoulliWithItsChance) {
  struct Case {
    const char* cmp;
    bool r_left;
    float p, low, high;
    bool cast_like;
    float chance;
  };
  const Case cases[] = {
      {"Less", true, 0.8f, 0, 1, false, 0.8f},           // R < p: StochasticDepth's form
      {"LessOrEqual", true, 0.8f, 0, 1, true, 0.8f},     // CastLike (optimize=False)
      {"Greater", false, 0.8f, 0, 1, false, 0.8f},       // p > R
      {"GreaterOrEqual", true, 0.25f, 0, 1, false, 0.75f},  // R >= p
      {"Less", false, 0.25f, 0, 1, false, 0.75f},        // p < R
      {"Less", true, 0.0f, -1, 3, false, 0.25f},         // low and high
      {"Less", true, 5.0f, 0, 1, false, 1.0f},           // clamped
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.cmp) + (c.r_left ? " R left" : " R right"));
    const Graph g = import_saved(draw_model(c.cmp, c.r_left, c.p, c.low, c.high, c.cast_like),
                                 "draw.onnx");
    ASSERT_EQ(g.nodes.size(), 2u);  // Bernoulli, Mul
    const Node* b = find_node(g, "Bernoulli");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->name, "draw");
    EXPECT_EQ(b->attr_int("dtype", 0), 1);
    EXPECT_EQ(g.value(b->outputs[0]).name, "mask");
    EXPECT_EQ(g.value(b->outputs[0]).type, (TensorType{DType::kFloat32, {3, 4}}));
    const Value& p = g.value(b->inputs[0]);
    ASSERT_TRUE(p.is_initializer());
    EXPECT_TRUE(p.constant);
    ASSERT_EQ(p.type, (TensorType{DType::kFloat32, {3, 4}}));
    for (int i = 0; i < 12; ++i) EXPECT_EQ(p.init->as<float>()[i], c.chance) << i;
  }
}

TEST(RandomRewriteErrors, OtherDrawsNameTheNode) {
  // Compared with a value computed at run time.
  onnx::ModelProto fed = draw_model("Less", true, 0.5f, 0, 1, false);
  fed.mutable_graph()->mutable_node(1)->set_input(1, "x");
  // The comparison read as a bool (no Cast).
  onnx::ModelProto as_bool = draw_model("Less", true, 0.5f, 0, 1, false);
  auto* g = as_bool.mutable_graph();
  g->mutable_node(2)->set_op_type("Where");
  g->mutable_node(2)->clear_attribute();
  g->mutable_node(2)->add_input("x");
  g->mutable_node(2)->add_input("p");
  // The uniform values used themselves.
  onnx::ModelProto raw = draw_model("Less", true, 0.5f, 0, 1, false);
  raw.mutable_graph()->mutable_node(3)->set_input(1, "r");
  for (const auto* m : {&fed, &as_bool, &raw}) {
    const std::string e = import_error(*m, "bad_draw.onnx");
    EXPECT_NE(e.find("node 'draw' (RandomUniformLike, opset 17): draws uniform values that are not "
                     "a Bernoulli mask"),
              std::string::npos)
        << e;
  }
}

// The default exporter with optimize=False computes Dropout's ratio and training_mode in small
// subgraphs: a Constant cast like the data (CastLike reading only the dtype of a value computed
// at run time) and a Constant cast to bool. Both fold to initializers, which
// autodiff/training_mode.h reads.
TEST(Import, DropoutRatioAndTrainingModeFromSubgraphsFold) {
  onnx::ModelProto m = model(20);
  m.set_ir_version(10);
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {-1, 4});
  set_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, 4});
  auto* c = add_node(g, "c", "Constant", {}, {"c"});
  auto* v = c->add_attribute();
  v->set_name("value_float");
  v->set_type(onnx::AttributeProto::FLOAT);
  v->set_f(0.1f);
  add_node(g, "relu", "Relu", {"x"}, {"h"});
  add_node(g, "like", "CastLike", {"c", "h"}, {"ratio"});
  auto* one = add_node(g, "one", "Constant", {}, {"one"});
  auto* i = one->add_attribute();
  i->set_name("value_int");
  i->set_type(onnx::AttributeProto::INT);
  i->set_i(1);
  add_int_attr(add_node(g, "to_bool", "Cast", {"one"}, {"training"}), "to", onnx::TensorProto::BOOL);
  add_node(g, "drop", "Dropout", {"h", "ratio", "training"}, {"y"});
  const Graph r = import_saved(m, "dropout_subgraphs.onnx");
  const Node* d = find_node(r, "Dropout");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(r.nodes.size(), 2u);  // Relu, Dropout
  const Value& ratio = r.value(d->inputs[1]);
  const Value& training = r.value(d->inputs[2]);
  ASSERT_TRUE(ratio.is_initializer() && training.is_initializer());
  EXPECT_EQ(ratio.type, (TensorType{DType::kFloat32, {}}));
  EXPECT_EQ(ratio.init->as<float>()[0], 0.1f);
  EXPECT_EQ(training.type, (TensorType{DType::kBool, {}}));
  EXPECT_TRUE(training.init->as<bool>()[0]);
}

}  // namespace
}  // namespace pt
