"""Swapped activations give exactly the gradients, outputs and BatchNorm stats of plain
PyTorch; the offload path runs on the CPU through force_copy."""

import pytest
import torch
from torch import nn

import outcore
from swap_testlib import (assert_same_grads, assert_same_state, autocast_bf16_pair, batch,
                          loss_of, tiny_cnn, twin)

FORCE = dict(min_swap_bytes=1, force_copy=True)


def test_gradients_outputs_and_batchnorm_equal_plain():
    plain = tiny_cnn()
    swapped = twin(plain)
    x, y = batch(8)
    ref_out = plain(x)
    nn.functional.cross_entropy(ref_out, y).backward()
    with outcore.swap(swapped, **FORCE) as s:
        out = swapped(x)
        nn.functional.cross_entropy(out, y).backward()
    assert torch.equal(out, ref_out)
    assert_same_grads(plain, swapped)
    assert_same_state(plain, swapped)           # running stats updated once, identically
    assert int(swapped[1].num_batches_tracked) == 1
    r = s.report()
    assert r.offloaded_tensors > 5 and r.bytes_to_host > 0
    assert r.bytes_to_device == r.bytes_to_host  # each swapped tensor came back exactly once


def test_several_steps_with_optimizer_match_plain():
    plain, swapped = tiny_cnn(), tiny_cnn()
    opt_a = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(swapped.parameters(), lr=0.1, momentum=0.9)
    s = outcore.swap(swapped, **FORCE)
    for step in range(3):
        x, y = batch(6, seed=step)
        for model, opt in ((plain, opt_a), (swapped, opt_b)):
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
        assert_same_grads(plain, swapped)
    s.close()
    assert_same_state(plain, swapped)
    assert s.report().forwards == 3


def test_autocast_bf16_matches_plain_autocast():
    plain = tiny_cnn()
    assert autocast_bf16_pair(plain, twin(plain), **FORCE).offloaded_tensors > 0


def test_small_tensors_stay():
    model = tiny_cnn()
    x, y = batch(2)
    with outcore.swap(model, min_swap_bytes="1MiB", force_copy=True) as s:
        loss_of(model, x, y).backward()
    r = s.report()
    assert r.offloaded_tensors == 0 and r.small_tensors == r.saved_tensors > 0


def test_cpu_tensors_without_force_copy_are_counted_as_host():
    model = tiny_cnn()
    x, y = batch(2)
    with outcore.swap(model, min_swap_bytes=1) as s:   # on the CPU, force_copy off
        loss_of(model, x, y).backward()
    r = s.report()
    assert r.offloaded_tensors == 0 and r.host_tensors == r.saved_tensors > 0
    assert f"{r.host_tensors} already in host memory" in r.summary()


class Square(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x):
        y = torch.relu(self.lin(x))   # relu saves y
        return y * y                  # mul saves y twice more


def test_one_copy_for_a_tensor_saved_three_times():
    torch.manual_seed(0)
    plain = Square()
    swapped = twin(plain)
    x = torch.randn(16, 32)
    plain(x).sum().backward()
    with outcore.swap(swapped, **FORCE) as s:
        swapped(x).sum().backward()
    assert_same_grads(plain, swapped)
    r = s.report()
    assert r.deduplicated == 2
    assert r.offloaded_tensors == 2       # x (saved by the linear) and y once
    assert r.bytes_to_host == 2 * 16 * 32 * 4 == r.bytes_to_device


def _events(trace, gen, kinds):
    return [e[2] for e in trace if e[1] == gen and e[0] in kinds]


class Block(nn.Module):
    """A ResNet bottleneck with a downsample branch: backward runs the branch first and
    needs the block input (saved by conv1 and by the branch) there."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, 2 * c, 3, padding=1, bias=False), nn.BatchNorm2d(2 * c)
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.down(x)
        return torch.relu(out)


@pytest.mark.parametrize("make", [tiny_cnn, lambda: nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), Block(), Block(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    nn.Linear(32, 10))])
def test_prefetch_in_the_order_backward_uses_from_the_first_step(make):
    model = make()
    plain = twin(model)
    with outcore.swap(model, prefetch_bytes=1, trace=True, **FORCE) as s:
        for step in range(2):
            x, y = batch(4, seed=step)
            for m in (model, plain):
                m.zero_grad()
                loss_of(m, x, y).backward()
            assert_same_grads(plain, model)
    n = s.report().offloaded_tensors // 2
    for gen in (1, 2):
        used = list(dict.fromkeys(_events(s.trace, gen, ("use",))))
        assert sorted(used) == list(range(n))
        # Every tensor fetched ahead of its use (none on demand), in the order of use ...
        assert _events(s.trace, gen, ("fetch",)) == []
        assert _events(s.trace, gen, ("prefetch",)) == used
        # ... and one at a time: after the first, each fetch follows a use.
        seq = [e[0] for e in s.trace if e[1] == gen and e[0] in ("prefetch", "use")]
        assert all(seq[i - 1] == "use" for i in range(2, len(seq)) if seq[i] == "prefetch")
    # The order is the reverse of saving, node by node: late layers first.
    first = _events(s.trace, 1, ("prefetch",))
    assert first[0] == n - 1 and first[-1] == 0


def test_prefetch_window_bounds_bytes_ahead():
    model = tiny_cnn(channels=16)
    x, y = batch(8)
    window = 3 * 8 * 16 * 16 * 16 * 4   # about three of the largest activations
    with outcore.swap(model, prefetch_bytes=window, trace=True, **FORCE) as s:
        loss_of(model, x, y).backward()
    ahead, peak, used = 0, 0, set()
    for kind, _, k, nb in s.trace:
        if kind == "prefetch":
            ahead += nb
            peak = max(peak, ahead)
            assert ahead <= window or ahead == nb
        elif kind == "use" and k not in used:
            used.add(k)
            ahead -= nb
    assert peak > max(nb for kind, _, _, nb in s.trace if kind == "offload")  # > 1 ahead
    assert ahead == 0


def test_retain_graph_second_backward_refetches():
    plain = tiny_cnn()
    swapped = twin(plain)
    x, y = batch(4)
    loss = loss_of(plain, x, y)
    loss.backward(retain_graph=True)
    loss.backward()
    with outcore.swap(swapped, **FORCE) as s:
        loss = loss_of(swapped, x, y)
        loss.backward(retain_graph=True)
        loss.backward()
    assert_same_grads(plain, swapped)
    r = s.report()
    assert r.bytes_to_device == 2 * r.bytes_to_host


def test_backward_after_the_block_still_works():
    plain = tiny_cnn()
    swapped = twin(plain)
    x, y = batch(4)
    loss_of(plain, x, y).backward()
    with outcore.swap(swapped, **FORCE):
        loss = loss_of(swapped, x, y)
    loss.backward()
    assert_same_grads(plain, swapped)


class KeepsStrides(torch.autograd.Function):
    seen: list = []

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        KeepsStrides.seen.append(x.stride())
        return g * 2 + 0 * x


def test_channels_last_comes_back_with_its_strides():
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    conv2 = twin(conv)
    x = torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last)

    def run(m):
        h = torch.relu(m(x))
        return KeepsStrides.apply(h).sum(), h.stride()

    loss, stride = run(conv)
    loss.backward()
    KeepsStrides.seen.clear()
    with outcore.swap(conv2, **FORCE) as s:
        loss2, _ = run(conv2)
    loss2.backward()
    assert KeepsStrides.seen == [stride] and stride != torch.empty(2, 8, 10, 10).stride()
    assert_same_grads(conv, conv2)
    assert s.report().offloaded_tensors >= 1


def test_a_graph_dropped_without_backward_frees_its_tensors():
    import gc
    import weakref

    model = tiny_cnn()
    x, _ = batch(4)
    refs = []
    probe = lambda m, a, out: refs.append(weakref.ref(out))  # noqa: E731
    hooks = [m.register_forward_hook(probe) for m in model]
    with outcore.swap(model, min_swap_bytes=1, force_copy=True, gpu_memory="64KiB",
                      reserve_bytes=0, prefetch_bytes=1024) as s:
        out = model(x)
        del out
    gc.collect()
    for h in hooks:
        h.remove()
    r = s.report()
    assert r.kept_tensors > 0 and r.offloaded_tensors > 0 and r.small_tensors == 0
    assert all(ref() is None for ref in refs)     # no reference cycle keeps them alive
    assert s.store.in_use_bytes == 0               # host runs of the dead graph came back
