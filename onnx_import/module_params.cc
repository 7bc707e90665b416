#include "onnx_import/module_params.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <set>
#include <string_view>

#include "core/ir.h"
#include "onnx_import/load.h"
#include "onnx_import/opset_adapt.h"
#include "onnx_import/proto_convert.h"

namespace pt {
namespace {

using Inits = std::map<std::string, onnx::TensorProto*>;

bool matches(const std::vector<std::string>& patterns, const std::string& name) {
  for (const std::string& p : patterns)
    if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

bool is_float(const onnx::TensorProto& t) {
  return is_floating(static_cast<DType>(t.data_type()));
}

std::vector<int64_t> dims(const onnx::TensorProto& t) { return {t.dims().begin(), t.dims().end()}; }

std::vector<int64_t> reversed(std::vector<int64_t> d) {
  std::reverse(d.begin(), d.end());
  return d;
}

// a == b, or (transposed) a == b^T for rank-2 tensors of one dtype. Tensors of a dtype pipetrain
// does not take compare as different (and below, as no fill).
bool same_values(const onnx::TensorProto& a, const onnx::TensorProto& b, bool transposed) {
  if (!numeric_dtype(a) || !numeric_dtype(b)) return false;
  const Tensor x = tensor_from_proto(a, a.name()), y = tensor_from_proto(b, b.name());
  if (x.type.dtype != y.type.dtype) return false;
  if (!transposed) return x.type.shape == y.type.shape && x.data == y.data;
  if (x.type.shape.size() != 2 || x.type.shape != reversed(y.type.shape)) return false;
  const size_t e = dtype_size(x.type.dtype);
  const int64_t r = x.type.shape[0], c = x.type.shape[1];
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      if (std::memcmp(&x.data[static_cast<size_t>(i * c + j) * e], &y.data[static_cast<size_t>(j * r + i) * e], e) != 0)
        return false;
  return true;
}

bool constant_fill(const onnx::TensorProto& t) {
  if (!numeric_dtype(t)) return false;
  const Tensor x = tensor_from_proto(t, t.name());
  const size_t e = dtype_size(x.type.dtype);
  for (size_t i = e; i < x.data.size(); i += e)
    if (std::memcmp(&x.data[i], &x.data[0], e) != 0) return false;
  return true;
}

// Python list repr ['', 'model', 'model.h.0'] -> its strings.
std::vector<std::string> quoted_strings(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = s.find('\''); i != std::string::npos; i = s.find('\'', i + 1)) {
    const size_t j = s.find('\'', i + 1);
    if (j == std::string::npos) break;
    out.push_back(s.substr(i + 1, j - i - 1));
    i = j;
  }
  return out;
}

// The FX node behind ONNX nodes (torch.export-based exporter): its name, the parameter
// placeholders its arguments name in order, and the module scopes it ran in.
struct FxNode {
  std::string name;
  std::string target;
  std::vector<std::string> placeholders;  // p_<path>
  std::vector<std::string> scopes;        // innermost first
};

std::optional<FxNode> fx_node(const onnx::NodeProto& n) {
  const auto props = metadata_props(n);
  auto it = props.find("pkg.torch.onnx.fx_node");
  if (it == props.end()) return std::nullopt;
  const std::string& s = it->second;
  FxNode f;
  const size_t colon = s.find(" :");
  if (s.empty() || s[0] != '%' || colon == std::string::npos) return std::nullopt;
  f.name = s.substr(1, colon - 1);
  const size_t t = s.find("target=");
  if (t != std::string::npos) f.target = s.substr(t + 7, s.find(']', t) - t - 7);
  const size_t args = s.find("args = (");
  for (size_t i = args == std::string::npos ? std::string::npos : s.find("%p_", args); i != std::string::npos;
       i = s.find("%p_", i + 1)) {
    size_t j = i + 1;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
    const std::string p = s.substr(i + 1, j - i - 1);
    if (std::find(f.placeholders.begin(), f.placeholders.end(), p) == f.placeholders.end())
      f.placeholders.push_back(p);
  }
  if (auto sc = props.find("pkg.torch.onnx.name_scopes"); sc != props.end()) {
    std::vector<std::string> scopes = quoted_strings(sc->second);
    if (!scopes.empty()) scopes.pop_back();  // the FX node's own name
    for (auto r = scopes.rbegin(); r != scopes.rend(); ++r)
      if (!r->empty()) f.scopes.push_back(*r);
  }
  return f;
}

// A module path as torch.export spells it in a placeholder: dots as underscores, lower case.
std::string placeholder_spelling(std::string s) {
  for (char& c : s) c = c == '.' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A bias input: Gemm C, Conv B, a normalisation's bias, an addend.
bool bias_role(const onnx::NodeProto& n, int i) {
  const std::string& op = n.op_type();
  return op == "Add" || (i == 2 && (op == "Gemm" || op == "Conv" || op == "LayerNormalization" ||
                                    op == "BatchNormalization" || op == "InstanceNormalization"));
}

bool ends_with_bias(const std::string& p) { return p.size() > 5 && p.compare(p.size() - 5, 5, ".bias") == 0; }

int64_t int_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return 0;
}

// An FX node's op from its name: embedding_1 -> embedding, slice -> slice.
std::string fx_op(const std::string& name) {
  size_t end = name.size();
  while (end > 0 && std::isdigit(static_cast<unsigned char>(name[end - 1]))) --end;
  return end > 0 && end < name.size() && name[end - 1] == '_' ? name.substr(0, end - 1) : name;
}

// The bytes of slice i of x along axis a.
std::string slice_bytes(const Tensor& x, size_t a, int64_t i) {
  const auto& s = x.type.shape;
  int64_t outer = 1, inner = static_cast<int64_t>(dtype_size(x.type.dtype));
  for (size_t k = 0; k < a; ++k) outer *= s[k];
  for (size_t k = a + 1; k < s.size(); ++k) inner *= s[k];
  std::string out;
  out.reserve(static_cast<size_t>(outer * inner));
  for (int64_t o = 0; o < outer; ++o)
    out.append(reinterpret_cast<const char*>(&x.data[static_cast<size_t>((o * s[a] + i) * inner)]),
               static_cast<size_t>(inner));
  return out;
}

// x with axis a cut to its first slice.
Tensor first_slice(const Tensor& x, size_t a) {
  Tensor y;
  y.type = x.type;
  y.type.shape[a] = 1;
  const std::string b = slice_bytes(x, a, 0);
  y.data.resize(b.size());
  std::memcpy(y.data.data(), b.data(), b.size());
  return y;
}

struct Site {
  onnx::NodeProto* node;
  int input;
};

class Restorer {
 public:
  Restorer(onnx::GraphProto* g, const ParameterChoices& c) : g_(g), choices_(c) {
    for (auto& t : *g->mutable_initializer()) inits_[t.name()] = &t;
    for (const onnx::ValueInfoProto* vi : value_infos()) {
      const auto props = metadata_props(*vi);
      auto kind = props.find("pkg.torch.export.graph_signature.InputSpec.kind");
      if (kind == props.end() || kind->second != "PARAMETER") continue;
      declared_.insert(vi->name());
      auto original = props.find("pkg.torch.onnx.original_node_name");
      if (original != props.end()) placeholder_names_[original->second] = vi->name();
    }
  }

  ModuleParameters run() {
    std::map<std::string, std::vector<onnx::NodeProto*>> groups;
    std::vector<std::string> order;
    std::set<std::string> with_fx;  // initializers some FX-annotated node reads
    for (auto& n : *g_->mutable_node()) {
      const std::optional<FxNode> f = fx_node(n);
      if (!f) continue;
      if (!groups.count(f->name)) order.push_back(f->name), fx_[f->name] = *f;
      groups[f->name].push_back(&n);
      for (const auto& i : n.input()) with_fx.insert(i);
    }
    for (const std::string& name : order) match_group(fx_[name], groups[name]);
    for (const auto& [f, p] : unmatched_)
      if (!inits_.count(p) && !matched_params_.count(p)) unread_parameter(fx_[f], groups[f], p);
    apply_fx_copies();
    untie_identities(with_fx);
    restore_transposed_ties(with_fx);
    name_generated_weights(with_fx);
    untie_by_value(with_fx);
    restore_folded();
    drop_unread();
    untie_named();
    return std::move(out_);
  }

 private:
  std::vector<const onnx::ValueInfoProto*> value_infos() const {
    std::vector<const onnx::ValueInfoProto*> v;
    for (const auto& i : g_->input()) v.push_back(&i);
    for (const auto& i : g_->value_info()) v.push_back(&i);
    return v;
  }

  // p_model_h_0_ln_2_weight -> model.h.0.ln_2.weight: the file's own record, else the FX node's
  // scopes (innermost first) as a prefix.
  std::string parameter_name(const FxNode& f, const std::string& placeholder) const {
    if (auto it = placeholder_names_.find(placeholder); it != placeholder_names_.end()) return it->second;
    for (const std::string& scope : f.scopes) {
      const std::string prefix = "p_" + placeholder_spelling(scope) + "_";
      if (placeholder.compare(0, prefix.size(), prefix) == 0) return scope + "." + placeholder.substr(prefix.size());
    }
    return "";
  }

  // The parameters of one FX node against the float initializers its ONNX nodes read.
  void match_group(const FxNode& f, const std::vector<onnx::NodeProto*>& nodes) {
    std::vector<std::string> params;
    for (const std::string& p : f.placeholders)
      if (std::string name = parameter_name(f, p); !name.empty()) params.push_back(name);
    std::vector<Site> open;
    std::set<std::string> matched;
    for (onnx::NodeProto* n : nodes)
      for (int i = 0; i < n->input_size(); ++i) {
        auto t = inits_.find(n->input(i));
        if (t == inits_.end() || !is_float(*t->second)) continue;
        if (std::find(params.begin(), params.end(), n->input(i)) != params.end()) matched.insert(n->input(i));
        else open.push_back({n, i});
      }
    for (const Site& s : open) {
      const onnx::TensorProto& t = *inits_.at(s.node->input(s.input));
      const bool want_bias = bias_role(*s.node, s.input);
      for (const std::string& p : params) {
        if (matched.count(p)) continue;
        if (ends_with_bias(p) != want_bias) continue;
        auto held = inits_.find(p);
        bool transposed = false;
        if (held != inits_.end()) {
          if (dims(*held->second) == dims(t)) transposed = false;
          else if (t.dims_size() == 2 && dims(*held->second) == reversed(dims(t))) transposed = true;
          else continue;
        } else {
          const bool linear = f.target.find("aten.linear") != std::string::npos;
          transposed = t.dims_size() == 2 && linear && s.input == 1 &&
                       (s.node->op_type() == "MatMul" || (s.node->op_type() == "Gemm" && !int_attr(*s.node, "transB")));
        }
        matched.insert(p);
        matched_params_.insert(p);
        read_as(s, t.name(), p, transposed);
        break;
      }
    }
    for (const std::string& p : params)
      if (!matched.count(p)) unmatched_.push_back({f.name, p});
  }

  // Site s reads initializer t where the module read parameter p.
  void read_as(const Site& s, const std::string& t, const std::string& p, bool transposed) {
    if (matches(choices_.tied, t)) return;
    auto held = inits_.find(p);
    if (held == inits_.end()) {
      fx_reads_[t][p].push_back({s, transposed});
      return;
    }
    if (!same_values(*inits_.at(t), *held->second, transposed)) return;  // not a copy of p
    if (transposed) {
      const std::string out = p + "@T";
      if (!transposes_.count(p)) {
        transposes_.insert(p);
        onnx::NodeProto* tr = g_->add_node();
        tr->set_op_type("Transpose");
        tr->set_name(out);
        tr->add_input(p);
        tr->add_output(out);
        onnx::AttributeProto* perm = tr->add_attribute();
        perm->set_name("perm");
        perm->set_type(onnx::AttributeProto::INTS);
        perm->add_ints(1);
        perm->add_ints(0);
        added_.insert(out);
      }
      s.node->set_input(s.input, out);
    } else {
      s.node->set_input(s.input, p);
    }
    out_.notes.push_back({t, "reads " + p + (transposed ? " transposed" : ""),
                          "the exporter folded a copy of parameter " + p + " (a tie): it trains as that parameter"});
  }

  // Initializers read in place of module parameters: one copy per parameter (a merge), or the
  // parameter's name recorded (a weight the exporter stored under a generated name).
  void apply_fx_copies() {
    for (auto& [t, by_param] : fx_reads_) {
      const bool shared = by_param.size() > 1 || declared_.count(t);
      std::vector<std::string> copies;
      for (auto& [p, sites] : by_param) {
        const bool transposed = sites.front().second;
        if (!shared) {
          out_.module_names[t] = {p, transposed};
          out_.parameters.insert(t);
          continue;
        }
        const std::string name = fresh_name(p);
        add_copy(t, name);
        if (transposed || name != p) out_.module_names[name] = {p, transposed};
        for (auto& [s, tr] : sites) s.node->set_input(s.input, name);
        copies.push_back(name);
      }
      if (copies.empty()) continue;
      std::string list;
      for (const std::string& c : copies) list += (list.empty() ? "" : ", ") + c;
      out_.notes.push_back({t, "untied into " + list,
                            "the exporter merged parameters of equal value; its nodes name the parameter each read"});
    }
  }

  // A parameter of an FX node that no initializer holds: a dropped zero bias comes back; any
  // other was folded into a constant.
  void unread_parameter(const FxNode& f, const std::vector<onnx::NodeProto*>& nodes, const std::string& p) {
    for (onnx::NodeProto* n : nodes) {
      if (!ends_with_bias(p) || restored_.count(p)) break;
      const std::string& op = n->op_type();
      auto w = n->input_size() > 1 ? inits_.find(n->input(1)) : inits_.end();
      if (w == inits_.end() || w->second->dims_size() < 1) continue;
      const onnx::TensorProto& wt = *w->second;
      if ((op == "Gemm" && n->input_size() == 2) || (op == "Conv" && n->input_size() == 2)) {
        int64_t size = wt.dims(0);
        if (op == "Gemm") size = int_attr(*n, "transB") ? wt.dims(0) : wt.dims(1);
        add_zero_bias(p, size, wt.data_type());
        n->add_input(p);
      } else if (op == "MatMul" && f.target.find("aten.linear") != std::string::npos && n->output_size() == 1) {
        add_zero_bias(p, wt.dims(wt.dims_size() - 1), wt.data_type());
        const std::string y = n->output(0), mm = y + "@no_bias";
        n->set_output(0, mm);
        onnx::NodeProto* add = g_->add_node();
        add->set_op_type("Add");
        add->set_name(n->name() + "@bias");
        add->add_input(mm);
        add->add_input(p);
        add->add_output(y);
        added_.insert(y);
      } else {
        continue;
      }
      restored_.insert(p);
      out_.notes.push_back({p, "restored as zeros",
                            "the exporter dropped this zero bias of " + f.target + "; it trains as in the module"});
    }
    if (!restored_.count(p) && !folded_.count(p)) {
      folded_.insert(p);
      out_.notes.push_back({p, "folded", "the exporter folded it into a constant (" + f.target +
                                             "); it is not trained: export with optimize=False to train it"});
    }
  }

  // The legacy exporter writes a merged parameter as `name = Identity(kept)`: name gets its own
  // initializer.
  void untie_identities(const std::set<std::string>& with_fx) {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
    std::set<std::string> outputs;
    for (const auto& o : g_->output()) outputs.insert(o.name());
    std::map<std::string, std::string> copies;  // kept initializer -> its copies
    for (auto& n : *g_->mutable_node()) {
      auto t = n.op_type() == "Identity" && n.input_size() == 1 ? inits_.find(n.input(0)) : inits_.end();
      if (t == inits_.end() || !is_float(*t->second) || with_fx.count(n.input(0)) || outputs.count(n.output(0)) ||
          inits_.count(n.output(0)) || matches(choices_.tied, n.input(0)) || matches(choices_.tied, n.output(0))) {
        *kept.Add() = std::move(n);
        continue;
      }
      add_copy(n.input(0), n.output(0));
      copies[n.input(0)] += (copies[n.input(0)].empty() ? "" : ", ") + n.output(0);
    }
    g_->mutable_node()->Swap(&kept);
    for (const auto& [t, list] : copies)
      out_.notes.push_back({t, "untied into " + list, "the exporter merged parameters of equal value (Identity nodes name each)"});
  }

  // A weight stored transposed under another name that equals a parameter the file holds (the
  // LM head of a tied embedding, folded as Transpose(W)) reads that parameter again: the first
  // such parameter by name. Each 2-D initializer is decoded once and known by the hash of its
  // values, so a model of many square weights compares only those that may be equal.
  void restore_transposed_ties(const std::set<std::string>& with_fx) {
    std::map<std::string, std::vector<Site>> readers;
    for (auto& n : *g_->mutable_node())
      if ((n.op_type() == "MatMul" || n.op_type() == "Gemm") && n.input_size() > 1 && inits_.count(n.input(1)) &&
          !with_fx.count(n.input(1)))
        readers[n.input(1)].push_back({&n, 1});
    if (readers.empty()) return;
    std::map<size_t, std::vector<std::string>> by_values;  // names in name order
    for (const auto& [p, pt] : inits_)
      if (pt->dims_size() == 2 && numeric_dtype(*pt) && !constant_fill(*pt))
        by_values[values_hash(tensor_from_proto(*pt, p), false)].push_back(p);
    for (const auto& [t, sites] : readers) {
      const onnx::TensorProto& tt = *inits_.at(t);
      if (tt.dims_size() != 2 || !is_float(tt) || matches(choices_.tied, t)) continue;
      auto same = by_values.find(values_hash(tensor_from_proto(tt, t), true));
      if (same == by_values.end()) continue;
      for (const std::string& p : same->second) {
        const onnx::TensorProto& pt = *inits_.at(p);
        if (p == t || dims(pt) != reversed(dims(tt)) || !same_values(tt, pt, true)) continue;
        for (const Site& s : sites) read_as(s, t, p, true);
        break;
      }
    }
  }

  // A hash of a 2-D tensor's values in row-major order, or of its transpose's.
  static size_t values_hash(const Tensor& x, bool transposed) {
    if (!transposed) return std::hash<std::string_view>{}(
        std::string_view(reinterpret_cast<const char*>(x.data.data()), x.data.size()));
    const size_t e = dtype_size(x.type.dtype);
    const int64_t r = x.type.shape[0], c = x.type.shape[1];
    std::string t(x.data.size(), '\0');
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j)
        std::memcpy(&t[static_cast<size_t>(j * r + i) * e], &x.data[static_cast<size_t>(i * c + j) * e], e);
    return std::hash<std::string>{}(t);
  }

  // The legacy exporter stores a Linear's weight transposed as `onnx::MatMul_N`, read by the
  // MatMul of its module (`/<module path>/MatMul`): it holds `<module path>.weight`.
  void name_generated_weights(const std::set<std::string>& with_fx) {
    std::map<std::string, std::set<std::string>> scopes;  // initializer -> scopes of its MatMul readers
    std::set<std::string> other_use;
    for (const auto& n : g_->node())
      for (int i = 0; i < n.input_size(); ++i) {
        if (!inits_.count(n.input(i)) || n.input(i).rfind("onnx::", 0) != 0 || with_fx.count(n.input(i))) continue;
        if (n.op_type() == "MatMul" && i == 1 && !scope_of(n).empty()) scopes[n.input(i)].insert(scope_of(n));
        else other_use.insert(n.input(i));
      }
    for (const auto& [t, s] : scopes) {
      const std::string p = *s.begin() + ".weight";
      if (s.size() != 1 || other_use.count(t) || inits_.count(p) || inits_.at(t)->dims_size() != 2) continue;
      out_.module_names[t] = {p, true};
      out_.parameters.insert(t);
    }
  }

  // Files without FX metadata: untie by value across module scopes.
  void untie_by_value(const std::set<std::string>& with_fx) {
    std::map<std::string, std::vector<Site>> sites;
    std::vector<std::string> order;
    for (auto& n : *g_->mutable_node())
      for (int i = 0; i < n.input_size(); ++i) {
        auto t = inits_.find(n.input(i));
        if (t == inits_.end() || !is_float(*t->second) || with_fx.count(n.input(i)) || !parameter_site(n, i, *t->second))
          continue;
        if (!sites.count(n.input(i))) order.push_back(n.input(i));
        sites[n.input(i)].push_back({&n, i});
      }
    for (const std::string& t : order) untie_one(t, sites[t]);
  }

  static bool parameter_site(const onnx::NodeProto& n, int i, const onnx::TensorProto& t) {
    const std::string& op = n.op_type();
    return ((op == "MatMul" || op == "Gemm") && i >= 1) || (op == "Conv" && i >= 1) || (op == "Gather" && i == 0) ||
           ((op == "LayerNormalization" || op == "BatchNormalization" || op == "InstanceNormalization") &&
            (i == 1 || i == 2)) ||
           (op == "Add" && t.dims_size() == 1 && t.dims(0) > 1);
  }

  static std::string scope_of(const onnx::NodeProto& n) {
    const std::string& name = n.name();
    const size_t slash = name.rfind('/');
    if (slash == std::string::npos || slash == 0) return "";
    std::string s = name.substr(name[0] == '/' ? 1 : 0, slash - (name[0] == '/' ? 1 : 0));
    std::replace(s.begin(), s.end(), '/', '.');
    return s;
  }

  static std::string role_of(const onnx::NodeProto& n, int i) {
    if (n.op_type() == "Add" || bias_role(n, i)) return "bias";
    return n.op_type() == "Gather" ? "table" : "weight";
  }

  void untie_one(const std::string& t, const std::vector<Site>& sites) {
    std::map<std::string, std::vector<Site>> by_scope;
    std::vector<std::string> scopes;
    std::set<std::string> roles;
    for (const Site& s : sites) {
      const std::string scope = scope_of(*s.node).empty() ? s.node->name() : scope_of(*s.node);
      if (!by_scope.count(scope)) scopes.push_back(scope);
      by_scope[scope].push_back(s);
      roles.insert(role_of(*s.node, s.input));
    }
    if (scopes.size() < 2 || matches(choices_.tied, t)) return;
    const bool forced = matches(choices_.untied, t);
    if (!forced && !constant_fill(*inits_.at(t))) {
      if (roles.size() > 1) {
        out_.notes.push_back({t, "kept tied", "one random tensor read as an embedding table and as a weight (a tie)"});
      } else {
        out_.notes.push_back({t, "kept tied", "read by " + std::to_string(scopes.size()) + " modules with values that are not one constant"});
        out_.warnings.push_back("initializer '" + t + "' is read by " + std::to_string(scopes.size()) + " modules (" +
                                scopes[0] + ", " + scopes[1] + (scopes.size() > 2 ? ", ..." : "") +
                                "): kept as one tied parameter; if the exporter merged separate parameters, "
                                "list it under parameters.untied (parameters.tied silences this)");
      }
      return;
    }
    std::string list;
    for (size_t k = 1; k < scopes.size(); ++k) {
      const std::vector<Site>& group = by_scope[scopes[k]];
      const std::string role = role_of(*group[0].node, group[0].input);
      const std::string base = scope_of(*group[0].node).empty() ? t + "@" + scopes[k]
                                                                : scopes[k] + "." + (role == "table" ? "weight" : role);
      const std::string name = fresh_name(base);
      add_copy(t, name);
      for (const Site& s : group) s.node->set_input(s.input, name);
      list += (list.empty() ? "" : ", ") + name;
    }
    out_.notes.push_back({t, "untied into " + list + " (the first module keeps " + t + ")",
                          forced ? "parameters.untied names it"
                                 : "every element is equal: an exporter's merge of equal values (parameters.tied keeps it tied)"});
  }

  // The module parameters the graph signature lists (`PARAMETER target='model.wpe.weight'`).
  std::set<std::string> signature_parameters() const {
    std::set<std::string> out;
    const auto props = metadata_props(*g_);
    auto it = props.find("pkg.torch.export.ExportedProgram.graph_signature");
    if (it == props.end()) return out;
    const std::string& s = it->second;
    const std::string mark = ": PARAMETER target='";
    for (size_t i = s.find(mark); i != std::string::npos; i = s.find(mark, i + 1)) {
      const size_t b = i + mark.size(), e = s.find('\'', b);
      if (e == std::string::npos) break;
      out.insert(s.substr(b, e - b));
    }
    return out;
  }

  // Constants the exporter's optimizer folded from module parameters no initializer holds (the
  // value info's `pkg.onnxscript.optimizer.folded_from` names them): a position table's rows
  // gathered at constant positions, a class token expanded over the batch. Where the fold only
  // selected and broadcast one parameter's elements, that parameter comes back holding the
  // elements the constant holds, and the constant is computed from it (Expand where it was
  // broadcast): the elements train as the module's (their gradient is the sum over the copies),
  // under the parameter's name. Any other fold stays a frozen constant, with a warning naming
  // the ways out; parameters.trained trains it as the file holds it.
  void restore_folded() {
    const std::set<std::string> params = signature_parameters();
    if (params.empty()) return;
    std::vector<std::pair<std::string, std::vector<std::string>>> folded;  // constant, names folded
    for (const onnx::ValueInfoProto* vi : value_infos()) {
      auto t = inits_.find(vi->name());
      if (t == inits_.end() || !is_float(*t->second) || declared_.count(vi->name()) ||
          out_.module_names.count(vi->name()) || out_.parameters.count(vi->name()))
        continue;
      const auto props = metadata_props(*vi);
      auto from = props.find("pkg.onnxscript.optimizer.folded_from");
      if (from != props.end()) folded.push_back({vi->name(), quoted_strings(from->second)});
    }
    for (const auto& [c, names] : folded) {
      std::vector<std::string> read, ops{fx_op(c)};
      for (const std::string& n : names)
        if (params.count(n)) read.push_back(n);
        else if (n.find('.') == std::string::npos && n.rfind("val_", 0) != 0) ops.push_back(fx_op(n));
      if (read.empty() || std::any_of(read.begin(), read.end(), [&](const std::string& p) {
            return inits_.count(p) || matched_params_.count(p) || restored_.count(p);
          }))
        continue;
      std::string list;
      for (const std::string& p : read) list += (list.empty() ? "" : ", ") + p;
      if (matches(choices_.trained, c)) {
        out_.parameters.insert(c);
        out_.notes.push_back({c, "trained as the file holds it", "folded from " + list + "; parameters.trained names it"});
      } else if (read.size() != 1 || !restore_selection(c, read[0], ops)) {
        out_.notes.push_back({c, "folded from " + list + ", not trained",
                              "the exporter's optimizer computed it from the parameter in a way import cannot undo"});
        out_.warnings.push_back("constant '" + c + "' is folded from parameter " + list +
                                " and stays frozen: export with optimize=False (samples/export_model.py) to train "
                                "the parameter, or train the constant as it is with parameters.trained: [" + c + "]");
      }
    }
  }

  // Restores parameter p from constant c, folded by ops (FX op names, c's own first) that only
  // select and broadcast: returns false where the ops or the values show anything else.
  bool restore_selection(const std::string& c, const std::string& p, const std::vector<std::string>& ops) {
    // Ops that select elements, add axes or broadcast, and the index arithmetic of positions.
    static const std::set<std::string> kSelect = {"embedding", "index_select", "index", "expand", "unsqueeze",
        "squeeze", "view", "reshape", "_unsafe_view", "slice", "select", "clone", "contiguous", "alias", "detach",
        "lift_fresh_copy", "_to_copy"};
    static const std::set<std::string> kIndex = {"arange", "add", "sub", "gather", "zeros", "zeros_like", "full"};
    if (!kSelect.count(ops[0])) return false;
    for (const std::string& op : ops)
      if (!kSelect.count(op) && !kIndex.count(op)) return false;
    const onnx::TensorProto& held = *inits_.at(c);
    const Tensor x = tensor_from_proto(held, c);
    // A broadcast repeats whole slices: each axis along which every slice is equal is cut to
    // one. A tensor of one value throughout (a zero-initialized token) tells nothing, so only an
    // expand over its first axis is undone there.
    Tensor r = x;
    const bool one_value = constant_fill(held);
    const bool expanded = std::find(ops.begin(), ops.end(), "expand") != ops.end();
    for (size_t a = 0; a < r.type.shape.size(); ++a) {
      if (r.type.shape[a] < 2 || (one_value && !(expanded && a == 0))) continue;
      const std::string first = slice_bytes(r, a, 0);
      bool same = true;
      for (int64_t i = 1; i < r.type.shape[a] && same; ++i) same = slice_bytes(r, a, i) == first;
      if (same) r = first_slice(r, a);
    }
    // Any other repeat (an index gathered twice) is two copies of one element, which training
    // the constant would let part: not undone.
    if (!one_value)
      for (size_t a = 0; a < r.type.shape.size(); ++a) {
        std::set<std::string> seen;
        for (int64_t i = 0; i < r.type.shape[a]; ++i)
          if (!seen.insert(slice_bytes(r, a, i)).second) return false;
      }
    const std::vector<int64_t> reduced = r.type.shape;
    // An embedding's rows come back as a table [rows, dim] where that still broadcasts to c.
    if (ops[0] == "embedding" && reduced.size() >= 2) {
      const size_t n = reduced.size();
      if (std::all_of(reduced.begin(), reduced.end() - 2, [](int64_t d) { return d == 1; }))
        r.type.shape = {reduced[n - 2], reduced[n - 1]};
    }
    tensor_to_proto(r, p, g_->add_initializer());
    out_.parameters.insert(p);
    restored_.insert(p);
    const std::vector<int64_t> full = dims(held);
    const std::string shape = shape_str(r.type.shape);
    google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
    for (auto& t : *g_->mutable_initializer())
      if (t.name() != c) *kept.Add() = std::move(t);
    g_->mutable_initializer()->Swap(&kept);
    reindex();
    if (r.type.shape == full) {
      for (auto& n : *g_->mutable_node())
        for (int i = 0; i < n.input_size(); ++i)
          if (n.input(i) == c) n.set_input(i, p);
      for (auto& o : *g_->mutable_output())
        if (o.name() == c) o.set_name(p);
    } else {
      Tensor to;
      to.type = TensorType{DType::kInt64, {static_cast<int64_t>(full.size())}};
      to.data.resize(full.size() * sizeof(int64_t));
      std::memcpy(to.data.data(), full.data(), to.data.size());
      const std::string shape_name = fresh_name(c + "@shape");
      tensor_to_proto(to, shape_name, g_->add_initializer());
      reindex();
      onnx::NodeProto* e = g_->add_node();
      e->set_op_type("Expand");
      e->set_name(c + "@restored");
      e->add_input(p);
      e->add_input(shape_name);
      e->add_output(c);
      added_.insert(c);
    }
    out_.notes.push_back({p, "restored from the folded constant " + c + " as " + shape,
                          "the exporter's optimizer folded the elements it selected (" + ops[0] +
                              "); they train as the module's, under its name"});
    return true;
  }

  // parameters.untied naming an initializer that several modules read and no rule untied (the
  // module's own tie: an embedding and its LM head, one placeholder read by two FX nodes): each
  // module gets a copy of its own, named after it (`<module>.weight`); the module whose name the
  // initializer has keeps it, else the first. One module reading it (a module called twice)
  // leaves nothing to untie, which is said in one line.
  void untie_named() {
    reindex();  // drop_unread moved the initializers
    std::set<std::string> untied;
    for (const ParameterNote& n : out_.notes)
      if (n.action.rfind("untied into", 0) == 0) untied.insert(n.initializer);
    std::map<std::string, std::vector<Site>> sites;
    std::vector<std::string> order;
    for (auto& n : *g_->mutable_node())
      for (int i = 0; i < n.input_size(); ++i) {
        const std::string& t = n.input(i);
        if (!inits_.count(t) || !is_float(*inits_.at(t)) || !matches(choices_.untied, t) || matches(choices_.tied, t) ||
            untied.count(t))
          continue;
        if (!sites.count(t)) order.push_back(t);
        sites[t].push_back({&n, i});
      }
    for (const std::string& t : order) untie_by_module(t, sites[t]);
  }

  void untie_by_module(const std::string& t, const std::vector<Site>& sites) {
    std::vector<std::string> modules;
    std::map<std::string, std::vector<Site>> by_module;
    for (const Site& s : sites) {
      const std::string m = module_of(*s.node);
      if (!by_module.count(m)) modules.push_back(m);
      by_module[m].push_back(s);
    }
    if (modules.size() < 2) {
      if (sites.size() > 1)
        out_.warnings.push_back("parameters.untied names '" + t + "', which one module (" + modules[0] +
                                ") reads at several nodes: it stays one tensor");
      return;
    }
    const size_t dot = t.rfind('.');
    const auto named = [&](const std::string& m) { return dot == std::string::npos ? t + "@" + m : m + t.substr(dot); };
    std::string keeper = modules[0], list;
    for (const std::string& m : modules)
      if (named(m) == t) keeper = m;
    for (const std::string& m : modules) {
      if (m == keeper) continue;
      const std::string name = fresh_name(named(m));
      add_copy(t, name);
      for (const Site& s : by_module[m]) s.node->set_input(s.input, name);
      list += (list.empty() ? "" : ", ") + name;
    }
    out_.notes.push_back({t, "untied into " + list + " (" + keeper + " keeps " + t + ")", "parameters.untied names it"});
  }

  // The module a node runs in: its FX node's innermost scope, else its name's folder, else its
  // name; a Transpose this pass added (a tie read transposed) runs in its first reader's.
  std::string module_of(const onnx::NodeProto& n) const {
    if (n.op_type() == "Transpose" && n.output_size() == 1 && added_.count(n.output(0)))
      for (const auto& r : g_->node())
        if (std::count(r.input().begin(), r.input().end(), n.output(0))) return module_of(r);
    if (const std::optional<FxNode> f = fx_node(n); f && !f->scopes.empty()) return f->scopes.front();
    return scope_of(n).empty() ? n.name() : scope_of(n);
  }

  std::string fresh_name(const std::string& want) const {
    std::string name = want;
    for (int k = 1; inits_.count(name) || node_outputs().count(name); ++k) name = want + "@" + std::to_string(k);
    return name;
  }

  const std::set<std::string>& node_outputs() const {
    if (outputs_.empty())
      for (const auto& n : g_->node())
        for (const auto& o : n.output()) outputs_.insert(o);
    return outputs_;
  }

  void add_copy(const std::string& from, const std::string& name) {
    onnx::TensorProto* t = g_->add_initializer();
    *t = *inits_.at(from);
    t->set_name(name);
    out_.parameters.insert(name);
    reindex();
  }

  void add_zero_bias(const std::string& name, int64_t size, int32_t dtype) {
    Tensor z;
    z.type = TensorType{static_cast<DType>(dtype), {size}};
    z.data.assign(static_cast<size_t>(z.type.bytes()), std::byte{0});
    tensor_to_proto(z, name, g_->add_initializer());
    out_.parameters.insert(name);
    reindex();
  }

  void reindex() {
    inits_.clear();
    for (auto& t : *g_->mutable_initializer()) inits_[t.name()] = &t;
  }

  // Added nodes (Transpose, bias Add) move to just before their first reader; initializers no
  // node reads any more are dropped.
  void drop_unread() {
    place_added_nodes();
    const std::set<std::string> read = names_read(*g_);
    google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
    for (auto& t : *g_->mutable_initializer())
      if (read.count(t.name()) || !is_float(t)) *kept.Add() = std::move(t);
      else out_.notes.push_back({t.name(), "dropped", "no node reads it once the parameters it stood for are restored"});
    g_->mutable_initializer()->Swap(&kept);
  }

  void place_added_nodes() {
    if (added_.empty()) return;
    std::map<std::string, onnx::NodeProto> added;
    google::protobuf::RepeatedPtrField<onnx::NodeProto> rest;
    for (auto& n : *g_->mutable_node())
      if (n.output_size() == 1 && added_.count(n.output(0)))
        added.emplace(n.output(0), std::move(n));
      else
        *rest.Add() = std::move(n);
    google::protobuf::RepeatedPtrField<onnx::NodeProto> ordered;
    for (auto& n : rest) {
      for (const auto& i : n.input()) {
        auto it = added.find(i);
        if (it == added.end()) continue;
        *ordered.Add() = std::move(it->second);
        added.erase(it);
      }
      *ordered.Add() = std::move(n);
    }
    for (auto& [name, n] : added) *ordered.Add() = std::move(n);  // graph outputs nobody reads
    g_->mutable_node()->Swap(&ordered);
  }

  onnx::GraphProto* g_;
  const ParameterChoices& choices_;
  Inits inits_;
  std::set<std::string> declared_;
  std::map<std::string, std::string> placeholder_names_;
  std::map<std::string, FxNode> fx_;
  // initializer -> parameter -> the sites reading it for that parameter (and whether transposed)
  std::map<std::string, std::map<std::string, std::vector<std::pair<Site, bool>>>> fx_reads_;
  std::vector<std::pair<std::string, std::string>> unmatched_;  // (FX node, parameter)
  std::set<std::string> matched_params_, transposes_, restored_, folded_;
  std::set<std::string> added_;  // outputs of the nodes this pass added
  mutable std::set<std::string> outputs_;
  ModuleParameters out_;
};

}  // namespace

ModuleParameters restore_module_parameters(onnx::GraphProto* g, const ParameterChoices& choices) {
  return Restorer(g, choices).run();
}

}  // namespace pt
