"""fit trusts an EdgeList that read_edges validated (no second full pass over 2e9 edges),
and checks everything else: raw arrays, hand-built edge lists, a read one changed since."""

import warnings

import numpy as np
import pytest
import torch

import outcore.embed.trainer as trainer_mod
from outcore.embed import EdgeList, EmbedConfig, EmbeddingTrainer, read_edges
from outcore.embed.checked import host_tensor
from outcore.errors import OutcoreError


def _scans(monkeypatch):
    calls = []
    real = trainer_mod.scan_edges

    def counted(*a):
        calls.append(1)
        return real(*a)
    monkeypatch.setattr(trainer_mod, "scan_edges", counted)
    return calls


def _trainer():
    return EmbeddingTrainer(EmbedConfig(dim=4, epochs=1, devices=["cpu"], progress=False))


def _one_line(why, fn):
    with pytest.raises(OutcoreError, match=why) as e:
        fn()
    assert "\n" not in str(e.value)


def test_an_edge_list_from_read_edges_is_not_scanned_again(tmp_path, monkeypatch):
    path = tmp_path / "g.tsv"
    path.write_text("0 1 0.5\n1 2 2\n2 3 1\n3 0 1\n")
    el = read_edges(str(path))
    calls = _scans(monkeypatch)
    tr = _trainer()
    tr.fit(el)
    assert calls == [] and tr.summary["positives_trained"] == 4
    tr.fit((el.src.copy(), el.dst.copy()))                        # raw arrays: checked
    tr.fit(EdgeList(el.src.copy(), el.dst.copy(), 4, el.weight.copy()))   # hand-built
    assert len(calls) == 2


def test_raw_bad_edges_are_still_refused_in_one_line():
    tr = _trainer()
    _one_line(r"node ids must lie in 0\.\.2", lambda: tr.fit(([0, -1], [1, 2])))
    _one_line(r"node ids must lie in 0\.\.2", lambda: tr.fit(([0, 1], [1, 3]), num_nodes=3))
    _one_line("edge weights", lambda: tr.fit(EdgeList(np.array([0, 1]), np.array([1, 2]), 3,
                                                      np.array([1.0, -1.0], np.float32))))


def test_a_read_edge_list_changed_since_is_checked_again(tmp_path, monkeypatch):
    path = tmp_path / "g.tsv"
    path.write_text("0 1\n1 2\n2 3\n3 0\n")
    calls = _scans(monkeypatch)
    tr = _trainer()
    el = read_edges(str(path))
    with pytest.raises(ValueError, match="read-only"):
        el.src[0] = -1                         # in place: refused
    el.src = np.array([0, 1, 2, 9], np.int32)  # another array: no longer vouched for
    _one_line(r"node ids must lie in 0\.\.3", lambda: tr.fit(el))
    el = read_edges(str(path))
    el.dst.flags.writeable = True              # made writeable again: checked again
    el.dst[1] = -1
    _one_line(r"node ids must lie in 0\.\.3", lambda: tr.fit(el))
    el = read_edges(str(path))
    el.num_nodes = 2                           # ids 2 and 3 now out of range
    _one_line(r"node ids must lie in 0\.\.1", lambda: tr.fit(el))
    assert len(calls) == 3


def test_string_id_columns_cannot_be_made_writeable_through_a_view(tmp_path):
    path = tmp_path / "s.tsv"
    path.write_text("a b\nb c\nc a\n")
    el = read_edges(str(path))
    assert el.names == ["a", "b", "c"]
    for a in (el.src, el.dst):
        try:
            a.flags.writeable = True           # a view of the parsed block, frozen too
        except ValueError:
            continue
        assert a.base is None                  # (or the array owns its data)


def test_read_only_edges_reach_torch_without_a_warning():
    a = np.arange(10, dtype=np.int32)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = host_tensor(a[2:7])
    assert torch.equal(t, torch.arange(2, 7, dtype=torch.int32))
    assert t.data_ptr() == a[2:].ctypes.data                   # no copy
