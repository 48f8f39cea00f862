"""outcore.gemm.Linear at the edges of torch.nn.Linear's contract: higher-order gradients
(refused, never silently wrong), a layer moved off the host or cast to a dtype matmul does
not take, odd inputs, and the usual module and optimizer round trips."""

import copy

import pytest
import torch
from torch import nn

from outcore.errors import OutcoreError
from outcore.gemm import Linear


def _pair(in_f=6, out_f=4, bias=True, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    layer = Linear(in_f, out_f, bias=bias, dtype=dtype, devices="cpu", tile=4)
    ref = nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    ref.load_state_dict(layer.state_dict())
    return layer, ref


def test_double_backward_through_the_input_gradient_is_refused():
    """create_graph=True: the input gradient depends on W, which the out-of-core products
    do not record; differentiating it again must raise, not give W.grad = 0 silently."""
    layer, _ = _pair()
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    g, = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(OutcoreError, match="double backward"):
        (y.sum() + g.square().sum()).backward()     # a gradient penalty beside the loss


def test_double_backward_through_the_weight_gradient_is_refused():
    """A gradient penalty on the weight's gradient (dW = dy.T @ x, dy = 2y depends on W)."""
    layer, _ = _pair()
    x = torch.randn(3, 6, dtype=torch.float64)
    gw, = torch.autograd.grad(layer(x).square().sum(), layer.weight, create_graph=True)
    with pytest.raises(OutcoreError, match="double backward"):
        gw.norm().backward()


def test_create_graph_where_nothing_depends_on_the_layer_is_exact():
    """A frozen layer whose gradient is constant: create_graph=True is fine, and the
    first-order gradient equals torch's."""
    layer, ref = _pair()
    for p in (*layer.parameters(), *ref.parameters()):
        p.requires_grad_(False)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    g_ref, = torch.autograd.grad(ref(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, g_ref)
    assert not g.requires_grad


def test_layer_moved_off_the_host_or_cast_is_a_clear_error():
    layer, _ = _pair(dtype=torch.float32)
    moved = copy.deepcopy(layer).to("meta")         # what .cuda() does, without a GPU
    with pytest.raises(TypeError, match=r"weight is on meta.*\.cpu\(\)"):
        moved(torch.randn(2, 6))
    half = copy.deepcopy(layer).half()
    with pytest.raises(TypeError, match=r"weight is torch.float16.*\.float\(\)"):
        half(torch.randn(2, 6).half())


def test_scalar_input_and_non_integer_sizes_are_one_line_errors():
    layer, _ = _pair()
    with pytest.raises(OutcoreError, match="0-d.*at least 1-d"):
        layer(torch.tensor(1.0, dtype=torch.float64))
    for bad in ((4.0, 3), ("4", 3), (4, True)):
        with pytest.raises(TypeError, match="integers"):
            Linear(*bad)


@pytest.mark.parametrize("make_x", [
    lambda: torch.randn(6, 5, dtype=torch.float64).T,                    # column-major
    lambda: torch.randn(2, 6, 3, dtype=torch.float64).transpose(1, 2),   # 3-d, strided
    lambda: torch.randn(1, 6, dtype=torch.float64).expand(4, 6),         # stride 0
    lambda: torch.randn(6, dtype=torch.float64),                         # 1-d
    lambda: torch.randn(0, 6, dtype=torch.float64),                      # empty batch
    lambda: torch.randn(2, 0, 6, dtype=torch.float64),
])
def test_strided_small_and_empty_inputs_match_torch(make_x):
    layer, ref = _pair()
    x = make_x().requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = layer(x), ref(x_ref)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    (y_ref * g).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad)
    torch.testing.assert_close(layer.bias.grad, ref.bias.grad)


def test_no_grad_inference_mode_and_inputs_without_grad():
    layer, ref = _pair(bias=False)
    x = torch.randn(3, 6, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x)
    assert not y.requires_grad
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), ref(x))
    layer(x).sum().backward()                       # x needs no grad: only W gets one
    ref(x).sum().backward()
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad)


@pytest.mark.parametrize("opt", [torch.optim.SGD, torch.optim.AdamW])
def test_optimizer_steps_and_state_dict_round_trip_match_torch(opt):
    layer, ref = _pair(dtype=torch.float32)
    x = torch.randn(8, 6)
    oa, ob = opt(layer.parameters(), lr=0.05), opt(ref.parameters(), lr=0.05)
    for _ in range(3):
        for m, o in ((layer, oa), (ref, ob)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    torch.testing.assert_close(layer.weight, ref.weight, rtol=1e-5, atol=1e-6)
    again = Linear(6, 4, devices="cpu")
    again.load_state_dict(layer.state_dict())
    torch.testing.assert_close(again(x), ref(x), rtol=1e-5, atol=1e-6)
