// onnx_import/op_table.h: the ops pipetrain takes. Import refuses any other op before doing any
// work; `pipetrain ops` prints this table.
#pragma once

#include <string>
#include <vector>

namespace pt {

enum class OpSupport {
  kRun,       // run by the backends, differentiated by autodiff
  kFoldOnly,  // accepted only on constant inputs: folded away at import
  kRewritten, // rewritten at import as ops of the table (onnx_import/fused_ops.h)
};

struct OpEntry {
  const char* domain;   // "" for the ONNX domain
  const char* op_type;
  OpSupport support;
  const char* note;     // what the entry covers, for `pipetrain ops`
  int since = 0;        // the first opset of the default domain that has the op; 0: kMinOpset
};

// The opsets an entry is taken at, as "13-28".
std::string opset_range(const OpEntry& e);

const std::vector<OpEntry>& op_table();
// nullptr when (domain, op_type) is not in the table. "ai.onnx" counts as "".
const OpEntry* find_op(const std::string& domain, const std::string& op_type);

}  // namespace pt
