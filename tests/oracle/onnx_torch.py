"""Runs an ONNX graph with PyTorch ops, so that torch autograd can differentiate it.

Each ONNX op maps onto the torch function with the same meaning; parameters are torch leaf
tensors (float64 by default) and gradients come from torch.autograd, an implementation nobody
here wrote. The forward is itself checked against onnxruntime by the callers, so a wrong mapping
shows up as a forward mismatch rather than as a silently different gradient.
"""
import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

TORCH_TYPES = {1: torch.float32, 6: torch.int32, 7: torch.int64, 9: torch.bool, 11: torch.float64}


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ints(t):
    return [int(v) for v in t.reshape(-1).tolist()]


def _pads2d(pads):
    # ONNX [h_begin, w_begin, h_end, w_end] -> F.pad order (w_begin, w_end, h_begin, h_end)
    return (pads[1], pads[3], pads[0], pads[2])


def _conv(x, w, b, a):
    pads = a.get("pads", [0, 0, 0, 0])
    if pads[0] != pads[2] or pads[1] != pads[3]:
        x = F.pad(x, _pads2d(pads))
        pads = [0, 0, 0, 0]
    return F.conv2d(x, w, b, stride=a.get("strides", [1, 1]), padding=(pads[0], pads[1]),
                    dilation=a.get("dilations", [1, 1]), groups=a.get("group", 1))


def _slice(x, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps):
        n = x.shape[ax]
        s = max(0, min(n, s + n if s < 0 else s))
        e = max(0, min(n, e + n if e < 0 else e))
        assert st == 1, "oracle: Slice steps other than 1"
        index[ax] = slice(s, e)
    return x[tuple(index)]


def _gemm(a_, b_, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    a_ = a_.t() if transA else a_
    b_ = b_.t() if transB else b_
    y = alpha * (a_ @ b_)
    return y + beta * c if c is not None else y


def _layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5, **_):
    axis = axis % x.dim()
    return F.layer_norm(x, x.shape[axis:], scale, bias, eps=epsilon)


def _batch_norm(x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0):
    # Running statistics that require no gradient (torch_train.py marks them so) are updated in
    # place in training mode, as torch's BatchNorm does; otherwise they are left as they were.
    if mean.requires_grad or var.requires_grad:
        mean, var = mean.detach().clone(), var.detach().clone()
    return F.batch_norm(x, mean, var, scale, bias, training=bool(training_mode),
                        momentum=1 - momentum, eps=epsilon)


def _clip(x, lo=None, hi=None):
    return torch.clamp(x, min=None if lo is None else lo.item(), max=None if hi is None else hi.item())


OPS = {
    "Add": lambda a, i: i[0] + i[1],
    "Sub": lambda a, i: i[0] - i[1],
    "Mul": lambda a, i: i[0] * i[1],
    "Div": lambda a, i: i[0] / i[1] if i[0].is_floating_point() else torch.div(i[0], i[1], rounding_mode="trunc"),
    "Pow": lambda a, i: torch.pow(i[0], i[1]),
    "Sqrt": lambda a, i: torch.sqrt(i[0]),
    "Neg": lambda a, i: -i[0],
    "Relu": lambda a, i: F.relu(i[0]),
    "Erf": lambda a, i: torch.erf(i[0]),
    "Tanh": lambda a, i: torch.tanh(i[0]),
    "Sigmoid": lambda a, i: torch.sigmoid(i[0]),
    "Clip": lambda a, i: _clip(*i),
    "Where": lambda a, i: torch.where(i[0], i[1], i[2]),
    "Equal": lambda a, i: torch.eq(i[0], i[1]),
    "Cast": lambda a, i: i[0].to(TORCH_TYPES[a["to"]]) if a["to"] != 1 else i[0].to(FLOAT),
    "Identity": lambda a, i: i[0],
    "MatMul": lambda a, i: torch.matmul(i[0], i[1]),
    "Gemm": lambda a, i: _gemm(*i, **a),
    "Softmax": lambda a, i: torch.softmax(i[0], dim=a.get("axis", -1)),
    "LogSoftmax": lambda a, i: torch.log_softmax(i[0], dim=a.get("axis", -1)),
    "LayerNormalization": lambda a, i: _layer_norm(*i, **a),
    "BatchNormalization": lambda a, i: _batch_norm(*i, **a),
    "Conv": lambda a, i: _conv(i[0], i[1], i[2] if len(i) > 2 else None, a),
    "GlobalAveragePool": lambda a, i: i[0].mean(dim=tuple(range(2, i[0].dim())), keepdim=True),
    "Flatten": lambda a, i: i[0].reshape(int(np.prod(i[0].shape[:a.get("axis", 1)])), -1),
    "Reshape": lambda a, i: i[0].reshape([d if d != 0 else i[0].shape[k] for k, d in enumerate(_ints(i[1]))]),
    "Transpose": lambda a, i: i[0].permute(a.get("perm", list(reversed(range(i[0].dim()))))),
    "Unsqueeze": lambda a, i: _unsqueeze(i[0], _ints(i[1])),
    "Squeeze": lambda a, i: _squeeze(i[0], _ints(i[1]) if len(i) > 1 else None),
    "Concat": lambda a, i: torch.cat(i, dim=a["axis"]),
    "Slice": lambda a, i: _slice(*i),
    "Gather": lambda a, i: _gather(i[0], i[1], a.get("axis", 0)),
    "Expand": lambda a, i: i[0] * torch.ones(_ints(i[1]), dtype=i[0].dtype) if i[0].is_floating_point()
    else i[0].expand(torch.broadcast_shapes(i[0].shape, tuple(_ints(i[1])))),
    "Shape": lambda a, i: torch.tensor(list(i[0].shape), dtype=torch.int64),
    "Range": lambda a, i: torch.arange(i[0].item(), i[1].item(), i[2].item(), dtype=i[0].dtype),
    "ConstantOfShape": lambda a, i: _constant_of_shape(i[0], a),
    "ReduceMean": lambda a, i: i[0].mean(dim=a["axes"], keepdim=bool(a.get("keepdims", 1))),
}

FLOAT = torch.float64


def _unsqueeze(x, axes):
    for ax in sorted(a % (x.dim() + len(axes)) for a in axes):
        x = x.unsqueeze(ax)
    return x


def _squeeze(x, axes):
    if axes is None:
        return x.squeeze()
    for ax in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(ax)
    return x


def _gather(data, idx, axis):
    idx = torch.where(idx < 0, idx + data.shape[axis], idx)
    if idx.dim() == 0:
        return data.select(axis, int(idx))
    return torch.index_select(data, axis, idx.reshape(-1)).reshape(
        data.shape[:axis] + idx.shape + data.shape[axis + 1:])


def _constant_of_shape(shape, a):
    value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
    t = torch.from_numpy(np.array(value).reshape(-1)[:1].copy())
    if t.is_floating_point():
        t = t.to(FLOAT)
    return t.expand(_ints(shape)).clone()


def to_torch(array):
    t = torch.from_numpy(np.array(array, copy=True))  # keeps 0-d arrays 0-d
    return t.to(FLOAT) if t.is_floating_point() else t


def parameters(model):
    """Every float initializer as a float64 leaf tensor that requires a gradient."""
    out = {}
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        t = to_torch(arr)
        if t.is_floating_point():
            t.requires_grad_(True)
        out[init.name] = t
    return out


def run(model, feeds, params):
    """Runs the graph; returns {output name: tensor}. feeds: numpy arrays by input name."""
    env = dict(params)
    for name, value in feeds.items():
        env[name] = to_torch(value)
    for node in model.graph.node:
        a = _attrs(node)
        if node.op_type == "Constant":
            env[node.output[0]] = to_torch(numpy_helper.to_array(a["value"]))
            continue
        if node.op_type not in OPS:
            raise NotImplementedError(f"oracle has no mapping for {node.op_type}")
        ins = [env[n] if n else None for n in node.input]
        while ins and ins[-1] is None:
            ins.pop()
        out = OPS[node.op_type](a, ins)
        env[node.output[0]] = out
    return {o.name: env[o.name] for o in model.graph.output}
