"""Parameter swapping (swap_params=True): weights leave the device between uses, come back
for their module's forward and backward, and are all on the device for the optimizer."""

import torch
from torch import nn

import outcore
from swap_testlib import (assert_same_grads, assert_same_state, autocast_bf16_pair, batch,
                          loss_of, tiny_cnn, twin)

FORCE = dict(min_swap_bytes=1, force_copy=True, swap_params=True)


def _resident(p: torch.Tensor) -> bool:
    return p.untyped_storage().nbytes() == p.numel() * p.element_size()


def test_training_steps_match_plain_sgd_and_adam():
    for make_opt in (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                     lambda ps: torch.optim.Adam(ps, lr=1e-3)):
        plain = tiny_cnn()
        swapped = twin(plain)
        opt_a, opt_b = make_opt(plain.parameters()), make_opt(swapped.parameters())
        with outcore.swap(swapped, **FORCE) as s:
            for step in range(3):
                x, y = batch(6, seed=step)
                for m, opt in ((plain, opt_a), (swapped, opt_b)):
                    opt.zero_grad()
                    loss_of(m, x, y).backward()
                    assert all(_resident(p) for p in m.parameters())   # back for the step
                    opt.step()
                assert_same_grads(plain, swapped)
        assert_same_state(plain, swapped)
        r = s.report()
        nbytes = sum(p.numel() * p.element_size() for p in swapped.parameters())
        assert r.param_bytes_to_host == 3 * nbytes        # changed by every step: copied out
        assert r.param_bytes_to_device >= 6 * nbytes      # in for forward and for backward


def test_weights_of_other_modules_are_off_the_device_during_forward():
    model = tiny_cnn()
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    seen = []

    def probe(module, args):
        seen.append([_resident(c.weight) for c in convs])

    with outcore.swap(model, **FORCE):
        handles = [c.register_forward_pre_hook(probe) for c in convs]   # after ours: fetched
        loss_of(model, *batch(4)).backward()
        for h in handles:
            h.remove()
    assert seen == [[True, False, False], [False, True, False], [False, False, True]]


def test_eval_forward_restores_every_parameter():
    model = tiny_cnn().eval()
    ref = twin(model)
    x, _ = batch(4)
    with outcore.swap(model, **FORCE):
        with torch.no_grad():
            out = model(x)
        assert all(_resident(p) for p in model.parameters())
    assert torch.equal(out, ref(x))


def test_frozen_parameters_are_copied_out_once():
    model = tiny_cnn()
    frozen = list(model[0].parameters()) + list(model[1].parameters())
    for p in frozen:
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with outcore.swap(model, **FORCE) as s:
        for step in range(3):
            opt.zero_grad()
            loss_of(model, *batch(4, seed=step)).backward()
            opt.step()
    nb = lambda ps: sum(p.numel() * p.element_size() for p in ps)  # noqa: E731
    trained = [p for p in model.parameters() if p.requires_grad]
    assert s.report().param_bytes_to_host == nb(frozen) + 3 * nb(trained)


def test_parameters_with_activation_budget_and_autocast():
    plain = tiny_cnn()
    rep = autocast_bf16_pair(plain, twin(plain), gpu_memory="64KiB", reserve_bytes=0,
                             prefetch_bytes=1024, **FORCE)
    assert rep.kept_tensors > 0


def test_model_state_unchanged_without_a_step():
    model = tiny_cnn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with outcore.swap(model, **FORCE):
        loss_of(model, *batch(4)).backward()
    assert all(torch.equal(before[k], v) or k.endswith(("running_mean", "running_var",
                                                        "num_batches_tracked"))
               for k, v in model.state_dict().items())
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters())


def test_optimizer_step_brings_parameters_back_after_a_forward_without_backward():
    model = tiny_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with outcore.swap(model, **FORCE):
        loss_of(model, *batch(4))                       # graph built, no backward
        assert not all(_resident(p) for p in model.parameters())
        opt.step()                                      # the pre-hook restores them first
        assert all(_resident(p) for p in model.parameters())
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    assert not _global_optimizer_pre_hooks             # removed on exit


def test_state_dict_after_a_forward_without_backward_holds_the_weights():
    model = tiny_cnn()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with outcore.swap(model, **FORCE):
        loss_of(model, *batch(4))                       # graph built, no backward
        assert not all(_resident(p) for p in model.parameters())
        got = model.state_dict()                        # the pre-hook restores them first
        assert all(torch.equal(want[k], v) for k, v in got.items()
                   if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
