#include "tests/exec/cuda/kernel_cases.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/pipetrain_ops.h"

namespace pt::testing {
namespace {

using D = std::vector<int64_t>;
using Attrs = std::map<std::string, AttrValue>;

constexpr DType kF32 = DType::kFloat32, kF64 = DType::kFloat64, kI32 = DType::kInt32,
                kI64 = DType::kInt64, kI8 = DType::kInt8, kBool = DType::kBool;

CaseInput uni(DType t, D shape, double lo = -1, double hi = 1) {
  return {{t, std::move(shape)}, CaseInput::kUniform, lo, hi, {}};
}
CaseInput f32(D shape, double lo = -1, double hi = 1) { return uni(kF32, std::move(shape), lo, hi); }
CaseInput ints(DType t, D shape, double lo, double hi) {
  return {{t, std::move(shape)}, CaseInput::kInts, lo, hi, {}};
}
CaseInput vals(DType t, D shape, std::vector<double> v) {
  return {{t, std::move(shape)}, CaseInput::kValues, 0, 0, std::move(v)};
}
CaseInput i64s(std::vector<double> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return vals(kI64, {n}, std::move(v));
}
CaseInput boolean(D shape) { return ints(kBool, std::move(shape), 0, 1); }
CaseInput scalar(float v) { return vals(kF32, {}, {v}); }
CaseInput cst(CaseInput in) {
  in.constant = true;
  return in;
}
CaseInput none() {
  CaseInput c;
  c.omitted = true;
  return c;
}
TensorType F(D shape) { return {kF32, std::move(shape)}; }
TensorType T(DType t, D shape) { return {t, std::move(shape)}; }
const TensorType kNone{};

struct Cases {
  std::vector<KernelCase> all;
  void add(std::string name, std::string op, std::vector<CaseInput> in,
           std::vector<TensorType> out, Attrs attrs = {}, std::string domain = "") {
    KernelCase c;
    c.name = std::move(name);
    c.op = std::move(op);
    c.domain = std::move(domain);
    c.inputs = std::move(in);
    c.outputs = std::move(out);
    c.attrs = std::move(attrs);
    all.push_back(std::move(c));
  }
  void grad(std::string name, std::string op, std::vector<CaseInput> in,
            std::vector<TensorType> out, Attrs attrs = {}) {
    add(std::move(name), std::move(op), std::move(in), std::move(out), std::move(attrs),
        kPipetrainDomain);
  }
};

void elementwise(Cases& c) {
  c.add("Add_SameShape", "Add", {f32({4, 33}), f32({4, 33})}, {F({4, 33})});
  c.add("Add_RowBroadcast", "Add", {f32({4, 33}), f32({33})}, {F({4, 33})});
  c.add("Add_BothBroadcast", "Add", {f32({2, 3, 1, 5}), f32({3, 4, 1})}, {F({2, 3, 4, 5})});
  c.add("Add_Int64", "Add", {ints(kI64, {3, 5}, -100, 100), ints(kI64, {5}, -9, 9)}, {T(kI64, {3, 5})});
  c.add("Add_Int8Scalar", "Add", {ints(kI8, {3, 5}, -50, 50), ints(kI8, {}, -9, 9)}, {T(kI8, {3, 5})});
  c.add("Sub_FirstBroadcast", "Sub", {f32({1, 33}), f32({4, 33})}, {F({4, 33})});
  c.add("Sub_Int32", "Sub", {ints(kI32, {2, 3}, -9, 9), ints(kI32, {2, 3}, -9, 9)}, {T(kI32, {2, 3})});
  c.add("Mul_MiddleBroadcast", "Mul", {f32({2, 3, 4}), f32({2, 1, 4})}, {F({2, 3, 4})});
  c.add("Mul_Double", "Mul", {uni(kF64, {3, 7}), uni(kF64, {3, 7})}, {T(kF64, {3, 7})});
  c.add("Div_Float", "Div", {f32({5, 9}), f32({9}, 0.5, 2)}, {F({5, 9})});
  c.add("Div_Int64ByZeroAndNegative", "Div",
        {vals(kI64, {6}, {7, -7, 7, -7, 5, 0}), vals(kI64, {6}, {2, 2, -2, -2, 0, 3})}, {T(kI64, {6})});
  c.add("Pow_Float", "Pow", {f32({4, 6}, 0.5, 2), f32({4, 6}, -2, 2)}, {F({4, 6})});
  c.add("Pow_FloatBaseInt64Exponent", "Pow", {f32({3, 4}, -2, 2), ints(kI64, {4}, 0, 3)}, {F({3, 4})});
  c.add("Pow_Int64", "Pow", {ints(kI64, {8}, -4, 4), ints(kI64, {8}, 0, 4)}, {T(kI64, {8})});
  c.add("Equal_Int64", "Equal", {ints(kI64, {4, 6}, 0, 3), ints(kI64, {6}, 0, 3)}, {T(kBool, {4, 6})});
  c.add("Equal_Float", "Equal", {vals(kF32, {5}, {1, 2, -0.5, 3, 0}), vals(kF32, {5}, {1, 2.5, -0.5, 3, -0.0})},
        {T(kBool, {5})});
  // Rows of a multiple of 4 floats run four outputs per thread (16-byte accesses): an operand
  // walking each row, one value per row, or one value in all.
  c.add("Add_RowBroadcastFourWide", "Add", {f32({6, 64}), f32({64})}, {F({6, 64})});
  c.add("Sub_ColumnBroadcastFourWide", "Sub", {f32({8, 16}), f32({8, 1})}, {F({8, 16})});
  c.add("Mul_ScalarFourWide", "Mul", {f32({5, 12}), f32({})}, {F({5, 12})});
  c.add("Div_FirstBroadcastFourWide", "Div", {f32({16}), f32({3, 16}, 0.5, 2)}, {F({3, 16})});
  c.add("Where_ThreeWayBroadcast", "Where", {boolean({2, 1, 5}), f32({2, 3, 5}), f32({5})}, {F({2, 3, 5})});
  c.add("Where_Int64", "Where", {boolean({4}), ints(kI64, {4}, -9, 9), ints(kI64, {}, -9, 9)}, {T(kI64, {4})});
  // Masks, comparisons and shape arithmetic computed at run time.
  c.add("Less_Float", "Less", {f32({4, 6}), f32({6})}, {T(kBool, {4, 6})});
  c.add("Greater_Int64", "Greater", {ints(kI64, {4, 6}, 0, 3), ints(kI64, {6}, 0, 3)}, {T(kBool, {4, 6})});
  c.add("LessOrEqual_Int32", "LessOrEqual", {ints(kI32, {5}, 0, 3), ints(kI32, {}, 0, 3)}, {T(kBool, {5})});
  c.add("GreaterOrEqual_Double", "GreaterOrEqual", {uni(kF64, {3, 4}), uni(kF64, {3, 1})}, {T(kBool, {3, 4})});
  c.add("And_Broadcast", "And", {boolean({2, 1, 5}), boolean({3, 5})}, {T(kBool, {2, 3, 5})});
  c.add("Or", "Or", {boolean({7}), boolean({7})}, {T(kBool, {7})});
  c.add("Xor", "Xor", {boolean({2, 7}), boolean({7})}, {T(kBool, {2, 7})});
  c.add("Not", "Not", {boolean({3, 5})}, {T(kBool, {3, 5})});
  c.add("Max_TwoBroadcast", "Max", {f32({4, 6}), f32({6})}, {F({4, 6})});
  c.add("Min_ThreeInt64", "Min", {ints(kI64, {2, 3}, -9, 9), ints(kI64, {3}, -9, 9), ints(kI64, {}, -9, 9)},
        {T(kI64, {2, 3})});
  c.add("Mod_Fmod", "Mod", {f32({4, 5}, -9, 9), f32({5}, 0.5, 3)}, {F({4, 5})}, {{"fmod", int64_t{1}}});
  c.add("Mod_FloorInt64", "Mod", {vals(kI64, {6}, {7, -7, 7, -7, 5, 0}), vals(kI64, {6}, {2, 2, -2, -2, 0, 3})},
        {T(kI64, {6})});
  c.add("Abs_Int32", "Abs", {ints(kI32, {9}, -100, 100)}, {T(kI32, {9})});
  c.add("Floor", "Floor", {f32({3, 17}, -6, 6)}, {F({3, 17})});
  c.add("Ceil", "Ceil", {f32({3, 17}, -6, 6)}, {F({3, 17})});
  c.add("Exp", "Exp", {f32({3, 17}, -2, 2)}, {F({3, 17})});
  c.add("Sqrt", "Sqrt", {f32({3, 17}, 0, 4)}, {F({3, 17})});
  c.add("Neg_Float", "Neg", {f32({3, 17})}, {F({3, 17})});
  c.add("Neg_Int32", "Neg", {ints(kI32, {9}, -100, 100)}, {T(kI32, {9})});
  c.add("Reciprocal", "Reciprocal", {f32({3, 17}, 0.5, 4)}, {F({3, 17})});
  c.add("Sin", "Sin", {f32({3, 17}, -6, 6)}, {F({3, 17})});
  c.add("HardSigmoid", "HardSigmoid", {f32({3, 17}, -6, 6)}, {F({3, 17})}, {{"alpha", 0.3f}, {"beta", 0.4f}});
  c.add("HardSwish", "HardSwish", {f32({3, 17}, -6, 6)}, {F({3, 17})});
  c.add("Cos", "Cos", {f32({3, 17}, -6, 6)}, {F({3, 17})});
  c.add("CumSum_MiddleAxis", "CumSum", {f32({4, 33, 5}), cst(i64s({1}))}, {F({4, 33, 5})});
  c.add("CumSum_ExclusiveReverse", "CumSum", {f32({3, 40}), cst(i64s({-1}))}, {F({3, 40})},
        {{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}});
  c.add("IsNaN", "IsNaN", {vals(kF32, {6}, {1, NAN, -0.0, INFINITY, -NAN, 3})}, {T(kBool, {6})});
  c.add("Relu", "Relu", {f32({3, 17})}, {F({3, 17})});
  c.add("Erf", "Erf", {f32({5, 41}, -4, 4)}, {F({5, 41})});
  c.add("Gelu_Erf", "Gelu", {f32({2, 3, 33}, -5, 5)}, {F({2, 3, 33})});
  c.add("Gelu_Tanh", "Gelu", {f32({2, 3, 33}, -5, 5)}, {F({2, 3, 33})}, {{"approximate", std::string("tanh")}});
  c.add("Gelu_Microsoft", "Gelu", {f32({4, 20}, -5, 5)}, {F({4, 20})}, {}, "com.microsoft");
  c.add("Tanh", "Tanh", {f32({3, 17}, -4, 4)}, {F({3, 17})});
  c.add("Sigmoid", "Sigmoid", {f32({3, 17}, -8, 8)}, {F({3, 17})});
  c.add("Clip_ConstantBounds", "Clip", {f32({4, 9}, -2, 2), cst(scalar(-0.5f)), cst(scalar(0.75f))}, {F({4, 9})});
  c.add("Clip_OmittedMin", "Clip", {f32({4, 9}, -2, 2), none(), cst(scalar(0.5f))}, {F({4, 9})});
  c.add("Clip_FedBounds", "Clip", {f32({4, 9}, -2, 2), scalar(-1.f), scalar(1.f)}, {F({4, 9})});
  c.add("Clip_Int64", "Clip", {ints(kI64, {10}, -20, 20), cst(vals(kI64, {}, {-5})), cst(vals(kI64, {}, {7}))},
        {T(kI64, {10})});
  c.add("Cast_FloatToInt64", "Cast", {f32({3, 5}, -9, 9)}, {T(kI64, {3, 5})}, {{"to", int64_t{7}}});
  c.add("Cast_Int64ToFloat", "Cast", {ints(kI64, {7}, -1000, 1000)}, {F({7})}, {{"to", int64_t{1}}});
  c.add("Cast_FloatToBool", "Cast", {vals(kF32, {4}, {0, 1.5, -0.0, -2})}, {T(kBool, {4})}, {{"to", int64_t{9}}});
  c.add("Cast_BoolToFloat", "Cast", {boolean({6})}, {F({6})}, {{"to", int64_t{1}}});
  c.add("Cast_Int32ToInt64", "Cast", {ints(kI32, {6}, -50, 50)}, {T(kI64, {6})}, {{"to", int64_t{7}}});
  c.add("Cast_DoubleToFloat", "Cast", {uni(kF64, {6}, -3, 3)}, {F({6})}, {{"to", int64_t{1}}});
  c.add("Dropout_InferenceWithMask", "Dropout", {f32({3, 5})}, {F({3, 5}), T(kBool, {3, 5})});
  c.add("Dropout_TrainingModeFalse", "Dropout",
        {f32({3, 5}), cst(scalar(0.3f)), cst(vals(kBool, {}, {0}))}, {F({3, 5})});
  c.grad("SeededDropout", "SeededDropout", {f32({4, 50}), vals(kI64, {}, {12345})},
         {F({4, 50}), T(kBool, {4, 50})}, {{"ratio", 0.25f}, {"stream", int64_t{77}}});
  c.grad("SeededBernoulli", "SeededBernoulli", {f32({4, 50}, 0, 1), vals(kI64, {}, {12345})},
         {F({4, 50})}, {{"stream", int64_t{78}}});
}

void linalg(Cases& c) {
  c.add("MatMul_2D", "MatMul", {f32({7, 13}), f32({13, 5})}, {F({7, 5})});
  c.add("MatMul_Batched", "MatMul", {f32({2, 3, 7, 13}), f32({2, 3, 13, 5})}, {F({2, 3, 7, 5})});
  c.add("MatMul_Weight2D", "MatMul", {f32({2, 7, 13}), f32({13, 5})}, {F({2, 7, 5})});
  c.add("MatMul_BroadcastA", "MatMul", {f32({7, 13}), f32({3, 13, 5})}, {F({3, 7, 5})});
  c.add("MatMul_PartialBroadcast", "MatMul", {f32({2, 1, 7, 13}), f32({1, 3, 13, 5})}, {F({2, 3, 7, 5})});
  c.add("MatMul_VectorLeft", "MatMul", {f32({13}), f32({13, 5})}, {F({5})});
  c.add("MatMul_VectorRight", "MatMul", {f32({7, 13}), f32({13})}, {F({7})});
  c.add("MatMul_Large", "MatMul", {f32({64, 256}), f32({256, 96})}, {F({64, 96})});
  c.add("Gemm_TransBRowBias", "Gemm", {f32({7, 13}), f32({5, 13}), f32({5})}, {F({7, 5})},
        {{"transB", int64_t{1}}});
  c.add("Gemm_TransAColumnC", "Gemm", {f32({13, 7}), f32({13, 5}), f32({7, 1})}, {F({7, 5})},
        {{"transA", int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.f}});
  c.add("Gemm_FullC", "Gemm", {f32({7, 13}), f32({13, 5}), f32({7, 5})}, {F({7, 5})});
  c.add("Gemm_NoC", "Gemm", {f32({7, 13}), f32({5, 13})}, {F({7, 5})},
        {{"transB", int64_t{1}}, {"alpha", 1.5f}});
  c.add("Gemm_ScalarC", "Gemm", {f32({7, 13}), f32({13, 5}), f32({})}, {F({7, 5})});
}

struct ConvGeo {
  std::string name;
  D x, w, y;
  Attrs attrs;
};

std::vector<ConvGeo> conv_geometries() {
  return {
      {"Dense3x3", {2, 3, 7, 6}, {4, 3, 3, 3}, {2, 4, 7, 6}, {{"pads", D{1, 1, 1, 1}}}},
      {"StridedAsymmetricPads", {2, 5, 9, 8}, {6, 5, 3, 2}, {2, 6, 4, 3},
       {{"strides", D{2, 3}}, {"pads", D{0, 2, 1, 0}}}},
      {"Dilated", {1, 4, 11, 10}, {3, 4, 3, 3}, {1, 3, 11, 4},
       {{"strides", D{1, 2}}, {"dilations", D{2, 3}}, {"pads", D{2, 1, 2, 3}}}},
      {"Grouped", {2, 8, 9, 9}, {12, 2, 3, 3}, {2, 12, 9, 9}, {{"group", int64_t{4}}, {"pads", D{1, 1, 1, 1}}}},
      {"DepthwiseStrided", {2, 16, 10, 10}, {16, 1, 3, 3}, {2, 16, 5, 5},
       {{"group", int64_t{16}}, {"strides", D{2, 2}}, {"pads", D{1, 0, 1, 1}}}},
      {"Pointwise", {2, 24, 6, 5}, {16, 24, 1, 1}, {2, 16, 6, 5}, {}},
      {"OneDimensional", {3, 4, 17}, {5, 4, 5}, {3, 5, 8}, {{"strides", D{2}}, {"pads", D{2, 1}}}},
      {"ThreeDimensional", {1, 2, 5, 6, 7}, {3, 2, 3, 3, 3}, {1, 3, 5, 6, 7}, {{"pads", D{1, 1, 1, 1, 1, 1}}}},
  };
}

void conv(Cases& c) {
  for (const ConvGeo& g : conv_geometries()) {
    c.add("Conv_" + g.name, "Conv", {f32(g.x), f32(g.w), f32({g.w[0]})}, {F(g.y)}, g.attrs);
    Attrs gi = g.attrs, gw = g.attrs;
    gi["input_shape"] = g.x;
    gw["weight_shape"] = g.w;
    c.grad("ConvGradInput_" + g.name, "ConvGradInput", {f32(g.y), f32(g.w)}, {F(g.x)}, gi);
    c.grad("ConvGradWeight_" + g.name, "ConvGradWeight", {f32(g.y), f32(g.x)}, {F(g.w)}, gw);
  }
  c.add("Conv_NoBias", "Conv", {f32({2, 3, 7, 6}), f32({4, 3, 3, 3})}, {F({2, 4, 5, 4})});
  c.add("Conv_SameUpper", "Conv", {f32({1, 3, 8, 8}), f32({4, 3, 3, 3})}, {F({1, 4, 4, 4})},
        {{"auto_pad", std::string("SAME_UPPER")}, {"strides", D{2, 2}}});
}

struct PoolGeo {
  std::string name;
  D x, y;
  Attrs attrs;
};

std::vector<PoolGeo> pool_geometries() {
  return {
      {"Symmetric", {2, 3, 9, 9}, {2, 3, 5, 5},
       {{"kernel_shape", D{3, 3}}, {"strides", D{2, 2}}, {"pads", D{1, 1, 1, 1}}}},
      {"AsymmetricPads", {2, 3, 7, 8}, {2, 3, 4, 4},
       {{"kernel_shape", D{3, 3}}, {"strides", D{2, 2}}, {"pads", D{1, 0, 1, 2}}}},
      {"CeilMode", {2, 3, 8, 7}, {2, 3, 4, 4},
       {{"kernel_shape", D{3, 2}}, {"strides", D{2, 2}}, {"pads", D{0, 1, 0, 0}}, {"ceil_mode", int64_t{1}}}},
      {"OneDimensional", {2, 3, 11}, {2, 3, 6},
       {{"kernel_shape", D{3}}, {"strides", D{2}}, {"pads", D{1, 1}}}},
  };
}

void pool(Cases& c) {
  for (const PoolGeo& g : pool_geometries()) {
    c.add("MaxPool_" + g.name, "MaxPool", {f32(g.x)}, {F(g.y)}, g.attrs);
    // X from {-3, -2, -1}: ties in every window, and padding (were it 0) would win.
    c.grad("MaxPoolGrad_" + g.name, "MaxPoolGrad", {f32(g.y), ints(kF32, g.x, -3, -1)}, {F(g.x)}, g.attrs);
    for (int include : {0, 1}) {
      if (include && g.name == "CeilMode") continue;  // declined by both backends
      Attrs a = g.attrs;
      a["count_include_pad"] = int64_t{include};
      const std::string suffix = g.name + (include ? "_IncludePad" : "_ExcludePad");
      c.add("AveragePool_" + suffix, "AveragePool", {f32(g.x)}, {F(g.y)}, a);
      a["input_shape"] = g.x;
      c.grad("AveragePoolGrad_" + suffix, "AveragePoolGrad", {f32(g.y)}, {F(g.x)}, a);
    }
  }
  const Attrs dilated = {{"kernel_shape", D{3, 2}}, {"strides", D{1, 1}}, {"pads", D{1, 1, 1, 0}},
                         {"dilations", D{2, 3}}};
  c.add("MaxPool_Dilated", "MaxPool", {f32({1, 2, 9, 9})}, {F({1, 2, 7, 7})}, dilated);
  c.grad("MaxPoolGrad_Dilated", "MaxPoolGrad", {f32({1, 2, 7, 7}), ints(kF32, {1, 2, 9, 9}, -3, -1)},
         {F({1, 2, 9, 9})}, dilated);
  c.add("GlobalAveragePool", "GlobalAveragePool", {f32({2, 3, 5, 7})}, {F({2, 3, 1, 1})});
}

void norm(Cases& c) {
  const D x{3, 4, 5, 7}, ch{4};
  c.add("BatchNormalization_Inference", "BatchNormalization",
        {f32(x, -1, 2), f32(ch, 0.5, 1.5), f32(ch), f32(ch), f32(ch, 0.5, 2)}, {F(x)},
        {{"epsilon", 1e-3f}});
  c.add("BatchNormalization_TrainingRunningStats", "BatchNormalization",
        {f32(x, -1, 2), f32(ch, 0.5, 1.5), f32(ch), f32(ch), f32(ch, 0.5, 2)}, {F(x), F(ch), F(ch)},
        {{"epsilon", 1e-3f}, {"momentum", 0.8f}, {"training_mode", int64_t{1}}});
  c.grad("BatchNormTraining", "BatchNormTraining", {f32(x, -1, 2), f32(ch, 0.5, 1.5), f32(ch)},
         {F(x), F(ch), F(ch)}, {{"epsilon", 1e-3f}});
  c.grad("BatchNormTraining_OnlyY", "BatchNormTraining", {f32({6, 5}, -1, 2), f32({5}), f32({5})},
         {F({6, 5})});
  c.grad("BatchNormGrad_NCHW", "BatchNormGrad", {f32(x), f32(x, -1, 2), f32(ch, 0.5, 1.5)},
         {F(x), F(ch), F(ch)}, {{"epsilon", 1e-3f}});
  c.grad("BatchNormGrad_NC", "BatchNormGrad", {f32({6, 5}), f32({6, 5}, -1, 2), f32({5}, 0.5, 1.5)},
         {F({6, 5}), F({5}), F({5})});
  c.grad("BatchNormGrad_WithoutDBias", "BatchNormGrad", {f32({2, 3, 17}), f32({2, 3, 17}), f32({3})},
         {F({2, 3, 17}), F({3}), kNone});
  c.add("LayerNormalization_LastAxisWithStats", "LayerNormalization",
        {f32({2, 3, 8}, -2, 3), f32({8}, 0.5, 1.5), f32({8})}, {F({2, 3, 8}), F({2, 3, 1}), F({2, 3, 1})});
  c.add("LayerNormalization_Axis1NoBias", "LayerNormalization", {f32({2, 3, 8}, -2, 3), f32({3, 8})},
        {F({2, 3, 8})}, {{"axis", int64_t{1}}, {"epsilon", 1e-3f}});
  c.add("LayerNormalization_WideRows", "LayerNormalization",
        {f32({16, 1000}, -2, 3), f32({1000}), f32({1000})}, {F({16, 1000})});
  const D s{2, 3, 8}, st{2, 3, 1};
  c.grad("LayerNormGrad_All", "LayerNormGrad",
         {f32(s), f32(s, -2, 3), f32({8}, 0.5, 1.5), f32(st), f32(st, 0.5, 2)}, {F(s), F({8}), F({8})});
  c.grad("LayerNormGrad_WithoutDScale", "LayerNormGrad",
         {f32({4, 21}), f32({4, 21}), f32({21}), f32({4, 1}), f32({4, 1}, 0.5, 2)},
         {F({4, 21}), kNone, F({21})});
  // Many rows over few columns: dScale and dBias summed in blocks of rows (sum_splits), the
  // last block shorter.
  c.grad("LayerNormGrad_ManyRows", "LayerNormGrad",
         {f32({300, 16}), f32({300, 16}, -2, 3), f32({16}, 0.5, 1.5), f32({300, 1}), f32({300, 1}, 0.5, 2)},
         {F({300, 16}), F({16}), F({16})});
  c.grad("LayerNormGrad_Axis1", "LayerNormGrad",
         {f32(s), f32(s), f32({3, 8}), f32({2, 1, 1}), f32({2, 1, 1}, 0.5, 2)}, {F(s), F({3, 8}), F({3, 8})},
         {{"axis", int64_t{1}}});
}

void softmax(Cases& c) {
  c.add("Softmax_LastAxis", "Softmax", {f32({2, 3, 7}, -3, 3)}, {F({2, 3, 7})});
  c.add("Softmax_MiddleAxis", "Softmax", {f32({2, 5, 4}, -3, 3)}, {F({2, 5, 4})}, {{"axis", int64_t{1}}});
  c.add("Softmax_WideRows", "Softmax", {f32({4, 1000}, -10, 10)}, {F({4, 1000})});
  c.add("LogSoftmax_LastAxis", "LogSoftmax", {f32({2, 3, 7}, -3, 3)}, {F({2, 3, 7})});
  c.add("LogSoftmax_FirstAxis", "LogSoftmax", {f32({5, 2, 3}, -3, 3)}, {F({5, 2, 3})}, {{"axis", int64_t{0}}});
  c.grad("SoftmaxGrad_LastAxis", "SoftmaxGrad", {f32({2, 3, 7}), f32({2, 3, 7}, 0, 1)}, {F({2, 3, 7})});
  c.grad("SoftmaxGrad_MiddleAxis", "SoftmaxGrad", {f32({2, 5, 4}), f32({2, 5, 4}, 0, 1)}, {F({2, 5, 4})},
         {{"axis", int64_t{1}}});
  c.grad("LogSoftmaxGrad_LastAxis", "LogSoftmaxGrad", {f32({2, 3, 7}), f32({2, 3, 7}, -5, 0)}, {F({2, 3, 7})});
  c.grad("LogSoftmaxGrad_MiddleAxis", "LogSoftmaxGrad", {f32({2, 5, 4}), f32({2, 5, 4}, -5, 0)},
         {F({2, 5, 4})}, {{"axis", int64_t{1}}});
}

void movement(Cases& c) {
  c.add("Reshape", "Reshape", {f32({2, 3, 4}), cst(i64s({6, 4}))}, {F({6, 4})});
  c.add("Flatten", "Flatten", {ints(kI64, {2, 3, 4}, -9, 9)}, {T(kI64, {2, 12})}, {{"axis", int64_t{1}}});
  c.add("Squeeze", "Squeeze", {f32({2, 1, 4}), cst(i64s({1}))}, {F({2, 4})});
  c.add("Unsqueeze", "Unsqueeze", {f32({2, 4}), cst(i64s({0}))}, {F({1, 2, 4})});
  c.add("Identity", "Identity", {boolean({3, 3})}, {T(kBool, {3, 3})});
  c.add("Transpose_SwapMiddle", "Transpose", {f32({2, 3, 4, 5})}, {F({2, 4, 3, 5})}, {{"perm", D{0, 2, 1, 3}}});
  // A last dim kept in place moves in 16-byte (8 floats) or 8-byte (6 floats) pieces.
  c.add("Transpose_HeadsSplitSixteenBytes", "Transpose", {f32({2, 6, 3, 8})}, {F({2, 3, 6, 8})},
        {{"perm", D{0, 2, 1, 3}}});
  c.add("Transpose_HeadsMergedEightBytes", "Transpose", {f32({2, 3, 5, 6})}, {F({2, 5, 3, 6})},
        {{"perm", D{0, 2, 1, 3}}});
  c.add("Transpose_Default", "Transpose", {ints(kI64, {3, 4, 5}, -9, 9)}, {T(kI64, {5, 4, 3})});
  c.add("Transpose_Bool", "Transpose", {boolean({6, 7})}, {T(kBool, {7, 6})}, {{"perm", D{1, 0}}});
  c.add("Concat_Axis1", "Concat", {f32({2, 3, 4}), f32({2, 1, 4}), f32({2, 2, 4})}, {F({2, 6, 4})},
        {{"axis", int64_t{1}}});
  c.add("Concat_Int64Axis0", "Concat", {ints(kI64, {2, 3}, -9, 9), ints(kI64, {1, 3}, -9, 9)}, {T(kI64, {3, 3})},
        {{"axis", int64_t{0}}});
  c.add("Split_ConstantSizes", "Split", {f32({2, 7, 3}), cst(i64s({2, 5}))}, {F({2, 2, 3}), F({2, 5, 3})},
        {{"axis", int64_t{1}}});
  c.add("Slice_NegativeStep", "Slice",
        {f32({5, 6, 7}), cst(i64s({1, -1})), cst(i64s({4, -8})), cst(i64s({0, 2})), cst(i64s({1, -2}))},
        {F({3, 6, 4})});
  c.add("Slice_RowsSixteenBytes", "Slice",
        {f32({6, 8}), cst(i64s({1})), cst(i64s({5})), cst(i64s({0}))}, {F({4, 8})});
  c.add("Slice_StepTwoToEnd", "Slice",
        {ints(kI64, {5, 6, 7}, -9, 9), cst(i64s({0})), cst(i64s({9.0e15})), cst(i64s({1})), cst(i64s({2}))},
        {T(kI64, {5, 3, 7})});
  c.add("Gather_EmbeddingNegativeIndices", "Gather", {f32({5, 4}), ints(kI64, {2, 3}, -5, 4)}, {F({2, 3, 4})});
  c.add("Gather_Axis1Int32", "Gather", {f32({2, 5, 3}), ints(kI32, {4}, -5, 4)}, {F({2, 4, 3})},
        {{"axis", int64_t{1}}});
  c.add("Gather_Int64Data", "Gather", {ints(kI64, {6, 2}, -99, 99), ints(kI64, {3}, 0, 5)}, {T(kI64, {3, 2})});
  c.add("Expand", "Expand", {f32({3, 1}), cst(i64s({2, 3, 4}))}, {F({2, 3, 4})});
  c.add("Tile", "Tile", {f32({2, 3, 4}), cst(i64s({2, 1, 3}))}, {F({4, 3, 12})});
  c.add("Trilu_UpperConstantK", "Trilu", {f32({2, 5, 7}), cst(i64s({1}))}, {F({2, 5, 7})});
  c.add("Trilu_LowerFedK", "Trilu", {ints(kI64, {4, 6}, -9, 9), vals(kI64, {}, {-1})}, {T(kI64, {4, 6})},
        {{"upper", int64_t{0}}});
  c.add("ReduceMax_Middle", "ReduceMax", {f32({2, 3, 4})}, {F({2, 1, 4})}, {{"axes", D{1}}});
  c.add("ReduceMin_AllInt64", "ReduceMin", {ints(kI64, {3, 4}, -99, 99)}, {T(kI64, {})}, {{"keepdims", int64_t{0}}});
  c.add("ReduceProd_Last", "ReduceProd", {f32({4, 5}, 0.5, 1.5)}, {F({4, 1})}, {{"axes", D{-1}}});
  c.add("ReduceMean_MiddleKeepDims", "ReduceMean", {f32({2, 3, 4})}, {F({2, 1, 4})}, {{"axes", D{1}}});
  c.add("ReduceMean_LastAxis", "ReduceMean", {f32({4, 300})}, {F({4, 1})}, {{"axes", D{-1}}});
  c.add("ReduceSum_SeparateAxes", "ReduceSum", {f32({2, 3, 4, 5}), cst(i64s({0, 2}))}, {F({3, 5})},
        {{"keepdims", int64_t{0}}});
  c.add("ReduceSum_All", "ReduceSum", {f32({3, 4})}, {F({})}, {{"keepdims", int64_t{0}}});
  c.add("ReduceSum_Rows", "ReduceSum", {f32({4096, 24}), cst(i64s({0}))}, {F({1, 24})});
  // Two reduced dims around kept ones, split into blocks of rows that do not divide the count.
  c.add("ReduceSum_SplitUneven", "ReduceSum", {f32({50, 3, 40, 7}), cst(i64s({0, 2}))}, {F({3, 7})},
        {{"keepdims", int64_t{0}}});
  c.add("Pad_ConstantValue", "Pad", {f32({2, 3, 4}), cst(i64s({0, 1, -1, 1, 0, 2})), cst(scalar(1.5f))},
        {F({3, 4, 5})});
  c.add("Pad_Int64AxesFedValue", "Pad",
        {ints(kI64, {2, 3, 2}, -9, 9), cst(i64s({2, 0, 0, 1})), vals(kI64, {}, {-7}), cst(i64s({-2, -1}))},
        {T(kI64, {2, 5, 3})});
  c.grad("GatherGrad_RepeatedNegativeAxis1", "GatherGrad",
         {f32({5, 3, 2, 3}), vals(kI64, {3, 2}, {0, -1, 2, 0, -4, 3})}, {F({5, 4, 3})},
         {{"axis", int64_t{1}}, {"data_shape", D{5, 4, 3}}});
  c.grad("GatherGrad_Int32Axis0", "GatherGrad", {f32({4, 5}), vals(kI32, {4}, {5, -1, 0, 2})}, {F({6, 5})},
         {{"data_shape", D{6, 5}}});
}

void gradients(Cases& c) {
  const D s{3, 37};
  c.grad("ReluGrad", "ReluGrad", {f32(s), f32(s)}, {F(s)});
  const CaseInput x = vals(kF32, {8}, {0, -1, 1, 0.5, -0.5, 2, -2, 1});
  c.grad("ClipGrad_ConstantBounds", "ClipGrad", {f32({8}), x, cst(scalar(-1.f)), cst(scalar(1.f))}, {F({8})});
  c.grad("ClipGrad_OmittedMin", "ClipGrad", {f32({8}), x, none(), cst(scalar(1.f))}, {F({8})});
  c.grad("ClipGrad_FedBounds", "ClipGrad", {f32({8}), x, scalar(-1.f), scalar(1.f)}, {F({8})});
  c.grad("ErfGrad", "ErfGrad", {f32({5, 41}), f32({5, 41}, -4, 4)}, {F({5, 41})});
  c.grad("GeluGrad_Erf", "GeluGrad", {f32({2, 3, 33}), f32({2, 3, 33}, -4, 4)}, {F({2, 3, 33})});
  c.grad("GeluGrad_Tanh", "GeluGrad", {f32({2, 3, 33}), f32({2, 3, 33}, -4, 4)}, {F({2, 3, 33})},
         {{"approximate", std::string("tanh")}});
  const CaseInput target = vals(kI64, {5}, {3, -100, 0, 6, -100});
  c.grad("SoftmaxCrossEntropy_Ignored", "SoftmaxCrossEntropy", {f32({5, 7}, -3, 3), target, scalar(0.25f)},
         {F({})});
  c.grad("SoftmaxCrossEntropy_Vocabulary", "SoftmaxCrossEntropy",
         {f32({2, 8, 1000}, -5, 5), ints(kI64, {2, 8}, 0, 999), scalar(1.f / 16)}, {F({})});
  c.grad("SoftmaxCrossEntropyGrad_Ignored", "SoftmaxCrossEntropyGrad",
         {scalar(1.5f), f32({5, 7}, -3, 3), target, scalar(0.25f)}, {F({5, 7})});
  c.grad("SoftmaxCrossEntropyGrad_IgnoreIndexAttribute", "SoftmaxCrossEntropyGrad",
         {scalar(1.f), f32({4, 6}, -3, 3), vals(kI64, {4}, {2, 1, 2, 5}), scalar(0.5f)}, {F({4, 6})},
         {{"ignore_index", int64_t{2}}});
}

// FusedAttention and its gradient: lengths that are not multiples of the CUDA tiles (16 queries,
// 32 keys), causal, float and bool masks broadcast, grouped-query heads, wide heads, omitted
// outputs, and a fully masked row (its LogSumExp -inf in the gradient's input, as the forward
// writes it).
void attention(Cases& c) {
  const Attrs causal{{"causal", int64_t{1}}};
  c.grad("FusedAttention_Causal", "FusedAttention", {f32({2, 3, 37, 16}), f32({2, 3, 45, 16}), f32({2, 3, 45, 8})},
         {F({2, 3, 37, 8}), F({2, 3, 37})}, causal);
  c.grad("FusedAttention_GroupedHeadsFloatMask", "FusedAttention",
         {f32({1, 4, 20, 32}), f32({1, 2, 33, 32}), f32({1, 2, 33, 32}), f32({20, 33}, -2, 0)},
         {F({1, 4, 20, 32}), kNone}, {{"scale", 0.3f}});
  std::vector<double> seen(35, 1);
  for (int j = 0; j < 7; ++j) seen[2 * 7 + j] = 0;  // query 2 sees no key
  for (int j = 4; j < 7; ++j) seen[j] = 0;
  c.grad("FusedAttention_BoolMaskFullyMaskedRow", "FusedAttention",
         {f32({1, 2, 5, 8}), f32({1, 2, 7, 8}), f32({1, 2, 7, 8}), vals(kBool, {1, 1, 5, 7}, seen)},
         {F({1, 2, 5, 8}), kNone});  // LogSumExp's -inf would make any difference fit the tolerance
  c.grad("FusedAttention_WideHeads", "FusedAttention", {f32({1, 2, 70, 128}), f32({1, 2, 70, 128}), f32({1, 2, 70, 96})},
         {F({1, 2, 70, 96}), F({1, 2, 70})}, causal);
  // The gradient's Y and LogSumExp are inputs like any other: LogSumExp above every score
  // (|scale q . k| < 3 here) keeps each p below 1.
  c.grad("FusedAttentionGrad_Causal", "FusedAttentionGrad",
         {f32({2, 3, 37, 8}), f32({2, 3, 37, 16}), f32({2, 3, 45, 16}), f32({2, 3, 45, 8}), f32({2, 3, 37, 8}),
          f32({2, 3, 37}, 3, 5)},
         {F({2, 3, 37, 16}), F({2, 3, 45, 16}), F({2, 3, 45, 8})}, causal);
  c.grad("FusedAttentionGrad_GroupedHeadsFloatMaskNoDQ", "FusedAttentionGrad",
         {f32({1, 4, 20, 32}), f32({1, 4, 20, 32}), f32({1, 2, 33, 32}), f32({1, 2, 33, 32}), f32({1, 4, 20, 32}),
          f32({1, 4, 20}, 3, 5), f32({1, 4, 1, 33}, -2, 0)},
         {kNone, F({1, 2, 33, 32}), F({1, 2, 33, 32})}, {{"scale", 0.3f}});
  std::vector<double> lse(10, 4);
  lse[2] = lse[7] = -std::numeric_limits<double>::infinity();  // query 2 of each head
  c.grad("FusedAttentionGrad_FullyMaskedRow", "FusedAttentionGrad",
         {f32({1, 2, 5, 8}), f32({1, 2, 5, 8}), f32({1, 2, 7, 8}), f32({1, 2, 7, 8}), f32({1, 2, 5, 8}),
          vals(kF32, {1, 2, 5}, lse), vals(kBool, {1, 1, 5, 7}, seen)},
         {F({1, 2, 5, 8}), F({1, 2, 7, 8}), F({1, 2, 7, 8})});
  c.grad("FusedAttentionGrad_OnlyDQ", "FusedAttentionGrad",
         {f32({1, 2, 70, 64}), f32({1, 2, 70, 64}), f32({1, 2, 70, 64}), f32({1, 2, 70, 64}), f32({1, 2, 70, 64}),
          f32({1, 2, 70}, 5, 7)},
         {F({1, 2, 70, 64}), kNone, kNone});
}

// The bytes of one input, from the case's seed.
Tensor generate(const CaseInput& in, std::mt19937& rng) {
  Tensor t;
  t.type = in.type;
  t.data.resize(static_cast<size_t>(t.type.bytes()));
  const int64_t n = t.type.numel();
  auto put = [&](int64_t i, double v) {
    switch (in.type.dtype) {
      case DType::kFloat32: t.as<float>()[i] = static_cast<float>(v); break;
      case DType::kFloat64: t.as<double>()[i] = v; break;
      case DType::kInt32: t.as<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::kInt64: t.as<int64_t>()[i] = static_cast<int64_t>(v); break;
      case DType::kInt8: t.as<int8_t>()[i] = static_cast<int8_t>(v); break;
      case DType::kUInt8: t.as<uint8_t>()[i] = static_cast<uint8_t>(v); break;
      case DType::kBool: t.as<bool>()[i] = v != 0; break;
      default: break;
    }
  };
  std::uniform_real_distribution<double> u(in.lo, in.hi);
  for (int64_t i = 0; i < n; ++i) {
    if (in.kind == CaseInput::kValues) {
      put(i, in.values.at(static_cast<size_t>(i)));
    } else if (in.kind == CaseInput::kInts) {
      std::uniform_int_distribution<int64_t> k(static_cast<int64_t>(in.lo), static_cast<int64_t>(in.hi));
      put(i, static_cast<double>(k(rng)));
    } else {
      put(i, u(rng));
    }
  }
  return t;
}

}  // namespace

std::vector<KernelCase> kernel_cases() {
  Cases c;
  elementwise(c);
  linalg(c);
  conv(c);
  pool(c);
  norm(c);
  softmax(c);
  movement(c);
  gradients(c);
  attention(c);
  return c.all;
}

// cuDNN takes unmasked attention, causal or not, grouped-query heads, more keys than queries.
// Q, K, V, Y and dY are rounded to bf16 (2^-9 relative each; fp16's 2^-12 is within it): a score moves by about 1e-2 at
// |score| <= 3, and the outputs are rounded once more, so the forward is held to 2e-2 and the
// gradients, where delta_i = dY_i . Y_i is subtracted, to 5e-2 (of each output's largest value,
// as every case here).
std::vector<KernelCase> half_attention_cases() {
  Cases c;
  const Attrs causal{{"causal", int64_t{1}}};
  c.grad("Attention_Causal", "FusedAttention", {f32({2, 4, 200, 64}), f32({2, 4, 200, 64}), f32({2, 4, 200, 64})},
         {F({2, 4, 200, 64}), F({2, 4, 200})}, causal);
  c.grad("Attention_GroupedHeadsMoreKeys", "FusedAttention",
         {f32({1, 8, 100, 128}), f32({1, 2, 150, 128}), f32({1, 2, 150, 128})}, {F({1, 8, 100, 128}), kNone},
         {{"scale", 0.15f}});
  c.grad("Attention_CausalMoreKeys", "FusedAttention",
         {f32({1, 2, 100, 64}), f32({1, 2, 150, 64}), f32({1, 2, 150, 64})}, {F({1, 2, 100, 64}), F({1, 2, 100})},
         causal);
  for (KernelCase& k : c.all) k.tol = 2e-2;
  const size_t forwards = c.all.size();
  c.grad("AttentionGrad_Causal", "FusedAttentionGrad",
         {f32({2, 4, 200, 64}), f32({2, 4, 200, 64}), f32({2, 4, 200, 64}), f32({2, 4, 200, 64}),
          f32({2, 4, 200, 64}), f32({2, 4, 200}, 3, 5)},
         {F({2, 4, 200, 64}), F({2, 4, 200, 64}), F({2, 4, 200, 64})}, causal);
  c.grad("AttentionGrad_GroupedHeadsNoDQ", "FusedAttentionGrad",
         {f32({1, 8, 100, 64}), f32({1, 8, 100, 64}), f32({1, 2, 150, 64}), f32({1, 2, 150, 64}),
          f32({1, 8, 100, 64}), f32({1, 8, 100}, 3, 5)},
         {kNone, F({1, 2, 150, 64}), F({1, 2, 150, 64})}, {{"scale", 0.15f}});
  for (size_t k = forwards; k < c.all.size(); ++k) c.all[k].tol = 5e-2;
  return c.all;
}

OneNode build_case(const KernelCase& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<Arg> args;
  for (const CaseInput& in : c.inputs) {
    if (in.omitted) {
      args.push_back(omitted());
      continue;
    }
    Tensor t = generate(in, rng);
    args.push_back(in.constant ? constant(std::move(t)) : fed(std::move(t)));
  }
  return build_node(c.name, c.op, c.domain, args, c.outputs, c.attrs, 17);
}

}  // namespace pt::testing
