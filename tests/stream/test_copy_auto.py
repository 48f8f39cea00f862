"""Engine(host_weight_copy="auto"), the default: the fused copies where they can run."""

import warnings
from types import SimpleNamespace

import pytest
import torch

from outcore import planner
from outcore.models import decoder
from outcore.stream import cast_kernel
from outcore.stream.blocks import build_groups, find_blocks
from outcore.stream.validate import AUTO_COPY_MARGIN, resolve_copy_option


def engine_like(device="cuda", dtype=torch.bfloat16, world=1):
    """What resolve_copy_option reads of an engine, for a 4-layer tiny decoder."""
    model = decoder("tiny", layers=4)
    path, container = find_blocks(model, None)
    return SimpleNamespace(device=torch.device(device), compute_dtype=dtype, world=world,
                           groups=build_groups(model, path, container), hold_updates=False)


def numel(e):
    return sum(g.numel for g in e.groups)


def test_auto_takes_the_fused_copies_on_a_gpu_with_room(monkeypatch):
    monkeypatch.setattr(planner, "host_available", lambda: 2**40)
    assert resolve_copy_option(engine_like(), "auto", 0, 8) == "fused"


@pytest.mark.parametrize("kw,held", [({"device": "cpu"}, 0),
                                     ({"dtype": torch.float32}, 0),
                                     ({"world": 2}, 0),
                                     ({}, "auto"), ({}, 2)])
def test_auto_keeps_no_copies_where_they_cannot_run(monkeypatch, kw, held):
    monkeypatch.setattr(planner, "host_available", lambda: 2**40)
    assert resolve_copy_option(engine_like(**kw), "auto", held, 8) is False


def test_auto_keeps_no_copies_without_spare_host_room(monkeypatch):
    e = engine_like()
    n = numel(e)
    blocks = sum(g.numel for g in e.groups[1:])
    staged = 4 * max(g.numel for g in e.groups[1:]) * 4   # 4 staged gradients
    copies = 8 * n + staged + 2 * blocks + AUTO_COPY_MARGIN * n
    monkeypatch.setattr(planner, "host_available", lambda: copies)
    assert resolve_copy_option(e, "auto", 0, 4) == "fused"
    monkeypatch.setattr(planner, "host_available", lambda: copies - 1)   # the state fits
    assert resolve_copy_option(e, "auto", 0, 4) is False


def test_auto_keeps_no_copies_and_says_nothing_without_the_kernel(monkeypatch):
    monkeypatch.setattr(planner, "host_available", lambda: 2**40)
    monkeypatch.setattr(cast_kernel, "load", lambda quiet=False: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_copy_option(engine_like(), "auto", 0, 8) is False


@pytest.mark.parametrize("value", [False, True, "fused", "device"])
def test_other_values_pass_through(value):
    assert resolve_copy_option(engine_like(device="cpu"), value, 0, 8) == value
