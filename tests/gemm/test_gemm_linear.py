"""outcore.gemm.Linear: same outputs and gradients as torch.nn.Linear; an MLP whose layer
is larger than the device budget trains like the in-memory one."""

import pytest
import torch
from torch import nn

from outcore.errors import OutcoreError
from outcore.gemm import Linear


def _twin(layer: Linear) -> nn.Linear:
    ref = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                    dtype=layer.weight.dtype)
    ref.load_state_dict(layer.state_dict())
    return ref


@pytest.mark.parametrize("bias,dtype,lead", [(True, torch.float32, (7,)),
                                             (False, torch.float64, (3, 5)),
                                             (True, torch.float64, (2, 1, 4))])
def test_outputs_and_gradients_match_torch_linear(bias, dtype, lead):
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=bias, dtype=dtype, devices=["cpu", "cpu"], tile=(8, 8, 16),
                   gpu_memory="32KiB")
    ref = _twin(layer)
    x = torch.randn(*lead, 24, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    g = torch.randn(*lead, 40, dtype=dtype)
    y, y_ref = layer(x), ref(x_ref)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, y_ref, **tol)
    (y * g).sum().backward()
    (y_ref * g).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, **tol)
    if bias:
        torch.testing.assert_close(layer.bias.grad, ref.bias.grad, **tol)


def test_gradients_from_a_broadcast_upstream_gradient():
    """y.sum() hands back a stride-0 expanded gradient: read through staging."""
    torch.manual_seed(1)
    layer = Linear(10, 6, devices="cpu", tile=4)
    ref = _twin(layer)
    x = torch.randn(9, 10)
    layer(x).sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)


def test_tf32x3_compute_reaches_all_three_products(monkeypatch):
    """compute="tf32x3" on the layer: forward, dx and dW each run split GEMMs (counted),
    and match torch.nn.Linear (on the CPU the split parts multiply in fp32)."""
    import outcore.gemm.worker as worker_mod
    calls = []
    real = worker_mod.mm_acc_split
    monkeypatch.setattr(worker_mod, "mm_acc_split", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(2)
    layer = Linear(24, 16, devices="cpu", tile=8, compute="tf32x3")
    ref = _twin(layer)
    x = torch.randn(5, 24, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = layer(x)
    n_forward = len(calls)
    y.square().sum().backward()
    ref(x_ref).square().sum().backward()
    assert n_forward > 0 and len(calls) > n_forward   # the backward's products split too
    torch.testing.assert_close(y, ref(x_ref.detach()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)


def test_mlp_with_a_layer_larger_than_the_budget_trains_like_torch():
    torch.manual_seed(2)
    big = Linear(96, 128, devices="cpu", gpu_memory="24KiB", tile=(16, 16))
    assert big.weight.numel() * 4 > 24 * 1024          # the weight alone exceeds the budget
    model = nn.Sequential(big, nn.ReLU(), nn.Linear(128, 3))
    ref = nn.Sequential(_twin(big), nn.ReLU(), nn.Linear(128, 3))
    ref[2].load_state_dict(model[2].state_dict())
    x, target = torch.randn(64, 96), torch.randint(0, 3, (64,))
    losses = []
    for net in (model, ref):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        run = []
        for _ in range(8):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), target)
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0][-1] < 0.8 * losses[0][0]                      # it learns
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-4          # like torch
    torch.testing.assert_close(model[0].weight, ref[0].weight, rtol=1e-4, atol=1e-5)


def test_bad_layer_input():
    layer = Linear(4, 3, devices="cpu")
    with pytest.raises(OutcoreError, match="5 features.*takes 4"):
        layer(torch.randn(2, 5))
    with pytest.raises(TypeError, match="float64.*cast x"):
        layer(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="CPU tensors"):
        layer(torch.randn(2, 4, device="meta"))
    with pytest.raises(TypeError, match="float16"):
        Linear(4, 3, dtype=torch.float16)


def test_small_weight_uses_the_pinned_copy_and_registers_no_unpin(monkeypatch):
    """pin_ returns a pinned copy of a small tensor: the layer must keep that copy (the
    original is not page-locked) and must not cudaHostUnregister memory it never registered."""
    import outcore.gemm.linear as lin
    copies = []

    def fake_pin(t):
        copies.append(t.clone())
        return copies[-1]

    finalized = []
    monkeypatch.setattr(lin, "pin_", fake_pin)
    monkeypatch.setattr(lin.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(lin.weakref, "finalize", lambda *a: finalized.append(a))
    layer = lin.Linear(4, 3)
    assert layer.weight.data.data_ptr() == copies[0].data_ptr()
    assert finalized == []
