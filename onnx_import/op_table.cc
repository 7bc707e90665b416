#include "onnx_import/op_table.h"

#include "onnx_import/load.h"

namespace pt {

const std::vector<OpEntry>& op_table() {
  using S = OpSupport;
  static const std::vector<OpEntry> table = {
      // Linear algebra
      {"", "MatMul", S::kRun, "batched, numpy broadcasting of batch dims"},
      {"", "Gemm", S::kRun, "alpha, beta, transA, transB"},
      // Element-wise, numpy broadcasting
      {"", "Add", S::kRun, ""},
      {"", "Sub", S::kRun, ""},
      {"", "Mul", S::kRun, ""},
      {"", "Div", S::kRun, ""},
      {"", "Pow", S::kRun, "float base and exponent"},
      {"", "Sqrt", S::kRun, ""},
      {"", "Neg", S::kRun, ""},
      {"", "Reciprocal", S::kRun, "RMSNorm's rsqrt as exported at opset 18+"},
      {"", "IsNaN", S::kRun, "float32 -> bool; not differentiable (NaN guards after Softmax)"},
      {"", "Sin", S::kRun, "rotary tables computed at run time"},
      {"", "Cos", S::kRun, "rotary tables computed at run time"},
      {"", "CumSum", S::kRun, "axis constant; exclusive, reverse"},
      {"", "Relu", S::kRun, ""},
      {"", "Erf", S::kRun, "GELU as exported by torch at opset <= 17"},
      {"", "Gelu", S::kRun, "approximate none|tanh", 20},
      {"com.microsoft", "Gelu", S::kRun, "onnxruntime contrib form"},
      {"", "Tanh", S::kRun, ""},
      {"", "Sigmoid", S::kRun, ""},
      {"", "HardSigmoid", S::kRun, "alpha, beta (MobileNetV3)"},
      {"", "HardSwish", S::kRun, "MobileNetV3", 14},
      {"", "Clip", S::kRun, "min/max as inputs (ReLU6)"},
      {"", "Where", S::kRun, "condition usually constant (masks)"},
      {"", "Equal", S::kRun, "not differentiable"},
      {"", "Cast", S::kRun, "between numeric dtypes"},
      // Normalisation and activations over an axis
      {"", "Softmax", S::kRun, "any axis"},
      {"", "LogSoftmax", S::kRun, "any axis"},
      {"", "LayerNormalization", S::kRun, "axis, epsilon", 17},
      {"", "BatchNormalization", S::kRun, "inference and training_mode=1"},
      // Convolution and pooling
      {"", "Conv", S::kRun, "2-D, groups, strides, pads, dilations"},
      {"", "MaxPool", S::kRun, "2-D"},
      {"", "AveragePool", S::kRun, "2-D, count_include_pad; 19+: dilations 1 only"},
      {"", "GlobalAveragePool", S::kRun, ""},
      // Shape and data movement
      {"", "Flatten", S::kRun, ""},
      {"", "Reshape", S::kRun, "shape constant after folding"},
      {"", "Transpose", S::kRun, ""},
      {"", "Squeeze", S::kRun, "axes constant"},
      {"", "Unsqueeze", S::kRun, "axes constant"},
      {"", "Concat", S::kRun, ""},
      {"", "Split", S::kRun, "split sizes constant; 18+: num_outputs"},
      {"", "Slice", S::kRun, "starts/ends/axes/steps constant"},
      {"", "Pad", S::kRun, "constant mode, pads constant; 18+: axes constant; 19+: not wrap"},
      {"", "Gather", S::kRun, "embeddings; indices not differentiable"},
      {"", "Expand", S::kRun, "shape constant"},
      {"", "Identity", S::kRun, ""},
      {"", "Dropout", S::kRun, "ratio and training_mode constant"},
      {"", "Bernoulli", S::kRun, "float32; a seeded 0/1 draw in run, training and evaluation",
       15},
      {"", "ReduceMean", S::kRun, "axes constant (18+: an input)"},
      {"", "ReduceSum", S::kRun, "axes constant"},
      // Masks, comparisons and shape arithmetic: folded where their inputs are constant, else run
      {"", "Trilu", S::kRun, "causal masks; k constant or a run-time scalar", 14},
      {"", "Less", S::kRun, "not differentiable"},
      {"", "Greater", S::kRun, "not differentiable"},
      {"", "Not", S::kRun, ""},
      {"", "And", S::kRun, ""},
      {"", "Or", S::kRun, ""},
      {"", "Min", S::kRun, "1-3 inputs; gradient for 2 (ties split the gradient)"},
      {"", "Max", S::kRun, "1-3 inputs; gradient for 2 (ties split the gradient)"},
      {"", "Abs", S::kRun, ""},
      {"", "Floor", S::kRun, "zero gradient"},
      {"", "Ceil", S::kRun, "zero gradient"},
      {"", "Tile", S::kRun, "repeats constant"},
      {"", "ReduceProd", S::kRun, "axes constant; no gradient"},
      {"", "ReduceMax", S::kRun, "axes constant; ties split the gradient"},
      {"", "ReduceMin", S::kRun, "axes constant; ties split the gradient"},
      {"", "LessOrEqual", S::kRun, "not differentiable"},
      {"", "GreaterOrEqual", S::kRun, "not differentiable"},
      {"", "Xor", S::kRun, ""},
      {"", "Mod", S::kRun, "fmod 0 (integers) and 1; no gradient"},
      {"", "Exp", S::kRun, ""},
      // Fused ops of opset 23, rewritten at import as ops above
      {"", "RMSNormalization", S::kRewritten, "as Mul, ReduceMean, Add, Sqrt, Reciprocal", 23},
      {"", "Attention", S::kRewritten, "3-D and 4-D, masks, causal, windows, softcap, past_key/value; "
                                        "not nonpad_kv_seqlen; as MatMul, Softmax, masks", 23},
      // Training-mode exports: stochastic depth's draw, rewritten at import (random_rewrite.h)
      {"", "RandomUniformLike", S::kRewritten, "compared with a constant and cast to float "
                                                "(stochastic depth): rewritten as Bernoulli"},
      // Shape computations, folded at import once dimensions are bound
      {"", "Shape", S::kFoldOnly, "input shape known once dims are bound"},
      {"", "Constant", S::kFoldOnly, ""},
      {"", "ConstantOfShape", S::kFoldOnly, "shape constant after folding"},
      {"", "Range", S::kFoldOnly, ""},
      {"", "Size", S::kFoldOnly, ""},
      // Position ids and attention masks as today's exporters build them
      {"", "GatherND", S::kRewritten, "batch_dims; constant indices: folded, or rewritten as Gather"},
      {"", "GatherElements", S::kRewritten, "constant indices: folded, or rewritten as Gather"},
      {"", "CastLike", S::kRewritten, "as Cast once the second input's dtype is known", 15},
      // Sequences as exports without their optimizer write torch.split (sequence_fold.h)
      {"", "SplitToSequence", S::kRewritten, "split sizes constant: as Split"},
      {"", "SequenceAt", S::kRewritten, "position constant: the part itself"},
      {"", "SequenceConstruct", S::kRewritten, "its inputs are the parts"},
      {"", "ConcatFromSequence", S::kRewritten, "as Concat (Unsqueeze for new_axis)"},
      {"", "SequenceLength", S::kRewritten, "a constant"},
  };
  return table;
}

std::string opset_range(const OpEntry& e) {
  const int64_t first = e.since > kMinOpset ? e.since : kMinOpset;
  return std::string(e.domain).empty() ? std::to_string(first) + "-" + std::to_string(kMaxOpset) : "any";
}

const OpEntry* find_op(const std::string& domain, const std::string& op_type) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  for (const OpEntry& e : op_table())
    if (d == e.domain && op_type == e.op_type) return &e;
  return nullptr;
}

}  // namespace pt
