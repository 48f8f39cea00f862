"""Expandable segments while a swap is open (swap/allocator.py): when the allocator's
settings change, which settings, and that the user's own settings are kept and restored.
The allocator itself is a fake here (no GPU on CI); test_swap_cuda.py runs the real one."""

import pytest
import torch
from torch import nn

import outcore
from outcore.swap import allocator


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(allocator, "_apply", seen.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(allocator, "_OPEN", 0)
    return seen


def model():
    return nn.Linear(4, 4)


def test_on_while_open_and_off_after(calls):
    s = outcore.swap(model())
    assert calls == ["expandable_segments:True"] and s.segments.held
    s.close()
    assert calls == ["expandable_segments:True", "expandable_segments:False"]
    s.close()   # a second close changes nothing
    assert len(calls) == 2


def test_the_users_other_settings_are_kept(calls, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    with outcore.swap(model()):
        pass
    assert calls == ["max_split_size_mb:512,expandable_segments:True",
                     "max_split_size_mb:512,expandable_segments:False"]


def test_nested_swaps_turn_it_on_once_and_off_at_the_last_close(calls):
    a, b = outcore.swap(model()), outcore.swap(model())
    a.close()
    assert calls == ["expandable_segments:True"]
    b.close()
    assert calls[-1] == "expandable_segments:False" and len(calls) == 2


@pytest.mark.parametrize("env", ["expandable_segments:False", "backend:cudaMallocAsync"])
def test_the_users_choice_is_left_alone_by_default(calls, monkeypatch, env):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", env)
    with outcore.swap(model()) as s:
        assert not s.segments.held
    assert calls == []


def test_true_overrides_the_environment_and_restores_it(calls, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    with outcore.swap(model(), expandable_segments=True):
        pass
    assert calls == ["expandable_segments:False,expandable_segments:True",
                     "expandable_segments:False"]


def test_false_and_no_cuda_leave_the_allocator_alone(calls, monkeypatch):
    with outcore.swap(model(), expandable_segments=False):
        pass
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with outcore.swap(model()):
        pass
    assert calls == []


def test_a_swap_that_fails_to_build_releases_its_hold(calls):
    m = torch.compile(model())   # swap_params refuses compiled models, after the hold
    with pytest.raises(outcore.OutcoreError):
        outcore.swap(m, swap_params=True)
    assert calls == ["expandable_segments:True", "expandable_segments:False"]


@pytest.mark.parametrize("bad", ["yes", 1, 0])
def test_a_bad_value_says_what_to_give(bad):
    with pytest.raises(TypeError, match="expandable_segments=.* must be None"):
        outcore.swap(model(), expandable_segments=bad)


def test_an_allocator_that_refuses_the_setting_leaves_the_swap_working(calls, monkeypatch):
    def refuse(settings):
        raise RuntimeError("unrecognized CachingAllocator option")
    monkeypatch.setattr(allocator, "_apply", refuse)
    with outcore.swap(model()) as s:
        assert not s.segments.held
    assert allocator._OPEN == 0
