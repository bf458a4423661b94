"""The stem's max pool keeps aten's kernels in a compiled CPU training graph, with eager's values
and gradients, and stays the plain module everywhere else."""

from __future__ import annotations

import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from mrcnn.model import MaskRCNN
from mrcnn.ops.max_pool import StemMaxPool2d


def _compiled(module: nn.Module):
    """``module`` compiled whole through AOTAutograd (so its backward is traced too); dynamo's graphs."""
    counter = CompileCounterWithBackend("aot_eager")
    return torch.compile(module, fullgraph=True, backend=counter), counter.graphs


def _ops(gm) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_a_compiled_step_calls_the_kept_op_and_gets_eagers_gradients():
    torch._dynamo.reset()
    plain = nn.MaxPool2d(3, 2, 1)
    pool, graphs = _compiled(StemMaxPool2d.like(plain))
    # Odd sizes and ties (a ReLU's zeros): the indices, and so the gradients, must be aten's.
    x = torch.randn(2, 8, 17, 23).relu().to(memory_format=torch.channels_last)
    grads = []
    for fn in (plain, pool):
        leaf = x.detach().requires_grad_()
        out = fn(leaf)
        (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
        grads.append((out.detach(), leaf.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert "mrcnn.max_pool2d_kept.default" in _ops(graphs[0])
    torch._dynamo.reset()


def test_without_gradients_the_graph_pools_as_the_plain_module():
    torch._dynamo.reset()
    pool, graphs = _compiled(StemMaxPool2d.like(nn.MaxPool2d(3, 2, 1)))
    with torch.no_grad():
        pool(torch.randn(1, 4, 9, 9))
    assert not any("mrcnn" in op for op in _ops(graphs[0]))
    torch._dynamo.reset()


def test_the_model_stem_uses_it(tiny_cfg):
    pool = MaskRCNN(tiny_cfg).backbone.body.maxpool
    assert isinstance(pool, StemMaxPool2d) and (pool.kernel_size, pool.stride, pool.padding) == (3, 2, 1)
