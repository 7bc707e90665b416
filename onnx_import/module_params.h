// onnx_import/module_params.h: gives back the module's parameters where the exporter merged or
// folded them. Runs on the file as read (read_model), before opset adaptation, both at import
// and when `train` writes the trained model, so the two see the same edits. In: the model and
// the user's overrides (config `parameters: {tied, untied}`). Out: the edited graph and a report.
//
// Exporters merge initializers of equal value (a fresh model's LayerNorm weights, its zero
// biases) and fold parameters into constants. What the file says decides what is restored:
//
// A file from the torch.export-based exporter names, on every node, the FX node it came from
// (metadata `pkg.torch.onnx.fx_node`), whose arguments name the module parameters it read
// (`%p_<module path>_weight`), and the module scope (`pkg.torch.onnx.name_scopes`). So for each
// FX node the parameters it read are known exactly, and matched to the initializers its ONNX
// nodes read (by name, then by role and order, a weight stored transposed matched by shape):
//   - an initializer read in place of parameters P1, P2, ... (a merge of equal values) becomes
//     one copy per parameter, each named after it;
//   - a generated initializer (val_N) that holds one parameter, transposed by the exporter, keeps
//     its name and is recorded as that parameter (`module_names`, for the safetensors output);
//   - a generated initializer equal to a parameter the file holds (or its transpose: the LM
//     head of a tied embedding, folded as Transpose(W)) reads that parameter again, so the tie
//     trains as one tensor;
//   - a zero bias the exporter dropped (linear/addmm/conv with a bias argument and no bias
//     input) comes back as a zero initializer under the bias's name;
//   - other parameters some FX node reads and no initializer holds (BatchNorm fused into a
//     convolution) are reported, with the re-export that keeps them.
// One parameter read at several FX nodes (a tie, or a module called twice) stays one tensor,
// unless `parameters.untied` names it (below).
//
// The exporter's optimizer also folds whole subgraphs that read one parameter into a constant,
// and records what it folded (`pkg.onnxscript.optimizer.folded_from` on the constant's value
// info; the graph signature lists the parameters). Where the folded ops only select and
// broadcast (a position table gathered at constant positions, a class token expanded over the
// batch, told by the FX op names and by the values: repeated slices are broadcast, and any other
// repeat refuses), the parameter comes back holding the elements the constant holds (a table as
// [rows, dim]), the constant becomes Expand(parameter), and the elements train as the module's.
// Rows the export never gathered are not in the file and do not come back. Any other fold stays
// a frozen constant with a warning naming the ways out; `parameters.trained` trains it as held.
//
// A file without that metadata (the legacy exporter, other tools): an initializer read at
// weight or bias inputs (MatMul/Gemm/Conv weights and biases, normalisation scale and bias,
// Gather tables, rank-1 addends) of nodes in different module scopes (the node name's folder,
// `/encoder/layer.0/ln/LayerNormalization` -> `encoder.layer.0.ln`) is
//   - untied when every element is equal (what value merges make of fresh weights; a tie of
//     parameters initialised to one constant cannot be told apart from it): one copy per scope,
//     named `<scope>.weight` or `<scope>.bias`;
//   - kept tied when it is random and read in different roles (an embedding table and a
//     projection weight: the tied LM head);
//   - otherwise kept tied with a warning naming the initializer and the override.
// `parameters.tied` (names or globs) keeps an initializer as the file has it; `parameters.untied`
// gives each scope its own copy even where the rules keep a tie, the module's own tie included
// (an embedding and its LM head: each module's copy is named after it, `<module>.weight`, and the
// module whose name the initializer has keeps it; one module reading it at several nodes is
// said in a warning); `parameters.trained` trains a folded constant as the file holds it.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

struct ModuleParameters {
  std::vector<ParameterNote> notes;                // core/ir.h
  std::vector<std::string> warnings;               // one line each
  std::map<std::string, ModuleName> module_names;  // initializer -> parameter
  std::set<std::string> parameters;                // initializers found to hold module parameters
};

ModuleParameters restore_module_parameters(onnx::GraphProto* g, const ParameterChoices& choices);

}  // namespace pt
