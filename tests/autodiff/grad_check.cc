#include "tests/autodiff/grad_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "autodiff/loss.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/stage_program.h"

namespace pt::test {

Filler uniform(float lo, float hi, float gap) {
  return [=](std::mt19937& rng) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (;;) {
      const float v = d(rng);
      if (gap <= 0 || std::fabs(v) >= gap) return v;
    }
  };
}

GraphMaker::GraphMaker() {
  g.name = "case";
  g.opsets[""] = 17;
}

static Tensor make_tensor(DType t, const std::vector<int64_t>& shape) {
  Tensor x;
  x.type = TensorType{t, shape};
  x.data.resize(static_cast<size_t>(x.type.bytes()));
  return x;
}

ValueId GraphMaker::input(const std::string& name, const std::vector<int64_t>& shape, Filler fill) {
  if (!fill) fill = uniform(-1, 1);
  Tensor t = make_tensor(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.type.numel(); ++i) t.as<float>()[i] = fill(rng);
  const ValueId v = g.add_value(name, t.type);
  g.inputs.push_back(v);
  feeds[name] = std::move(t);
  return v;
}

ValueId GraphMaker::int_input(const std::string& name, const std::vector<int64_t>& shape,
                              std::vector<int64_t> data) {
  Tensor t = make_tensor(DType::kInt64, shape);
  std::memcpy(t.data.data(), data.data(), t.data.size());
  const ValueId v = g.add_value(name, t.type);
  g.inputs.push_back(v);
  feeds[name] = std::move(t);
  return v;
}

ValueId GraphMaker::param(const std::string& name, const std::vector<int64_t>& shape, Filler fill) {
  if (!fill) fill = uniform(-1, 1);
  Tensor t = make_tensor(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.type.numel(); ++i) t.as<float>()[i] = fill(rng);
  return g.add_initializer(name, std::move(t));
}

ValueId GraphMaker::ints(const std::vector<int64_t>& data) {
  Tensor t = make_tensor(DType::kInt64, {static_cast<int64_t>(data.size())});
  if (!data.empty()) std::memcpy(t.data.data(), data.data(), t.data.size());
  return g.add_initializer("const" + std::to_string(counter_++), std::move(t), true);
}

ValueId GraphMaker::floats(const std::vector<int64_t>& shape, const std::vector<float>& data) {
  Tensor t = make_tensor(DType::kFloat32, shape);
  std::memcpy(t.data.data(), data.data(), t.data.size());
  return g.add_initializer("const" + std::to_string(counter_++), std::move(t), true);
}

ValueId GraphMaker::bools(const std::vector<int64_t>& shape, const std::vector<bool>& data) {
  Tensor t = make_tensor(DType::kBool, shape);
  for (size_t i = 0; i < data.size(); ++i) t.as<bool>()[i] = data[i];
  return g.add_initializer("const" + std::to_string(counter_++), std::move(t), true);
}

std::vector<ValueId> GraphMaker::op_n(const std::string& op, std::vector<ValueId> inputs,
                                      const std::vector<TensorType>& outs,
                                      std::map<std::string, AttrValue> attrs) {
  Node n;
  n.name = op + std::to_string(counter_++);
  n.op_type = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  for (const TensorType& t : outs)
    n.outputs.push_back(t.dtype == DType::kUndefined
                            ? kNoValue
                            : g.add_value(n.name + ".out" + std::to_string(n.outputs.size()), t));
  g.add_node(n);
  g.rebuild_uses();
  return n.outputs;
}

ValueId GraphMaker::op(const std::string& op, std::vector<ValueId> inputs,
                       const std::vector<int64_t>& shape, std::map<std::string, AttrValue> attrs,
                       const std::string& domain) {
  auto out = op_n(op, std::move(inputs), {TensorType{DType::kFloat32, shape}}, std::move(attrs));
  g.nodes.back().domain = domain;
  return out[0];
}

namespace {

using Store = std::map<std::string, Tensor>;

void run_graph(StageProgram& p, const Graph& g, Store& store) {
  std::vector<Buffer> in;
  for (ValueId v : g.inputs) in.push_back({store.at(g.value(v).name).data.data(), &g.value(v).type});
  p.run(in);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const Buffer b = p.output(k);
    Tensor t;
    t.type = *b.type;
    const auto* d = static_cast<const std::byte*>(b.data);
    t.data.assign(d, d + b.type->bytes());
    store[g.value(g.outputs[k]).name] = std::move(t);
  }
}

// The forward with every parameter turned into an input, so that it can be perturbed.
Graph params_as_inputs(const Graph& g, std::vector<std::string>* params) {
  Graph out = g;
  std::vector<ValueId> inits;
  for (ValueId v : out.initializers) {
    if (!out.value(v).is_parameter()) {
      inits.push_back(v);
      continue;
    }
    params->push_back(out.value(v).name);
    out.value(v).init = nullptr;
    out.inputs.push_back(v);
  }
  out.initializers = inits;
  out.rebuild_uses();
  return out;
}

}  // namespace

CheckResult check_gradients(GraphMaker& m, const std::string& loss_output) {
  m.g.rebuild_uses();
  BackwardOptions bo;
  for (ValueId v : m.g.inputs)
    if (m.g.value(v).type.dtype == DType::kFloat32 && m.g.value(v).name != kLossScale)
      bo.grad_inputs.push_back(m.g.value(v).name);
  bo.loss_output = loss_output;
  BackwardGraphs bw = build_backward(m.g, bo);

  if (std::getenv("PT_DUMP"))
    std::cerr << "F:\n" << graph_text(bw.forward) << "B:\n" << graph_text(bw.backward_input)
              << "W:\n" << graph_text(bw.backward_weight);
  CpuBackend backend(1);
  StageProgram f(bw.forward, backend), b(bw.backward_input, backend), w(bw.backward_weight, backend);
  Store store = m.feeds;
  run_graph(f, bw.forward, store);
  // R per output with a gradient input.
  std::map<std::string, std::vector<float>> r;
  for (const std::string& name : bw.output_grads) {
    const ValueId v = bw.backward_input.find(name);
    Tensor t = make_tensor(DType::kFloat32, bw.backward_input.value(v).type.shape);
    std::uniform_real_distribution<float> d(-1, 1);
    for (int64_t i = 0; i < t.type.numel(); ++i) t.as<float>()[i] = d(m.rng);
    r[name.substr(5)].assign(t.as<float>(), t.as<float>() + t.type.numel());
    store[name] = std::move(t);
  }
  run_graph(b, bw.backward_input, store);
  for (const std::string& p : bw.params) {
    const ValueId v = bw.backward_weight.find(grad_acc_name(p));
    store[grad_acc_name(p)] = make_tensor(DType::kFloat32, bw.backward_weight.value(v).type.shape);
  }
  run_graph(w, bw.backward_weight, store);

  // f(x) = sum <R, Y> (or the loss itself), on the forward with parameters as inputs.
  std::vector<std::string> params;
  Graph fg = params_as_inputs(m.g, &params);
  StageProgram fp(fg, backend);
  Store feeds = m.feeds;
  for (const std::string& p : params) feeds[p] = *m.g.value(m.g.find(p)).init;
  const auto objective = [&]() {
    std::vector<Buffer> in;
    for (ValueId v : fg.inputs) in.push_back({feeds.at(fg.value(v).name).data.data(), &fg.value(v).type});
    fp.run(in);
    double sum = 0;
    for (size_t k = 0; k < fg.outputs.size(); ++k) {
      const std::string& name = fg.value(fg.outputs[k]).name;
      const Buffer out = fp.output(k);
      if (!loss_output.empty()) {
        if (name == loss_output) sum += out.as<float>()[0];
        continue;
      }
      auto it = r.find(name);
      if (it == r.end()) continue;
      for (size_t i = 0; i < it->second.size(); ++i)
        sum += static_cast<double>(it->second[i]) * out.as<float>()[i];
    }
    return sum;
  };

  CheckResult res;
  const double h = 1e-2;
  const auto compare = [&](const std::string& x, const std::string& gname) {
    const Tensor& grad = store.at(gname);
    Tensor& data = feeds.at(x);
    for (int64_t i = 0; i < data.type.numel(); ++i) {
      float& xi = data.as<float>()[i];
      const float keep = xi;
      xi = keep + static_cast<float>(h);
      const double up = objective();
      xi = keep - static_cast<float>(h);
      const double down = objective();
      xi = keep;
      const double fd = (up - down) / (2 * h);
      const double an = grad.as<float>()[i];
      const double err = std::fabs(fd - an) / (1 + std::fabs(an));
      ++res.checked;
      if (err > res.worst) {
        res.worst = err;
        res.worst_at = gname + "[" + std::to_string(i) + "]";
      }
      EXPECT_LE(err, 2e-3) << gname << "[" << i << "]: finite difference " << fd
                           << ", gradient " << an;
    }
  };
  for (const std::string& x : bo.grad_inputs) compare(x, grad_name(x));
  for (const std::string& p : bw.params) compare(p, grad_name(p));
  return res;
}

}  // namespace pt::test
