"""Under DistributedDataParallel (gloo, 2 processes on the CPU) swapping gives the same
gradients and BatchNorm buffers as DDP without it, with and without parameter swapping."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import outcore
from swap_testlib import batch, loss_of, tiny_cnn


def _grads_and_buffers(model):
    return ([p.grad.clone() for p in model.parameters()],
            [b.clone() for b in model.buffers()])


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    try:
        x, y = batch(8, seed=10)
        x, y = x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]   # this rank's share
        results = {}
        for name, options in (("plain", None),
                              ("acts", dict(min_swap_bytes=1, force_copy=True)),
                              ("params", dict(min_swap_bytes=1, force_copy=True,
                                              swap_params=True))):
            model = DDP(tiny_cnn(seed=0))
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            s = outcore.swap(model, **options) if options else None
            for step in range(2):
                opt.zero_grad()
                loss_of(model, x, y).backward()
                opt.step()
            results[name] = _grads_and_buffers(model.module)
            if s is not None:
                s.close()
                results[name + "_swapped"] = s.report().bytes_to_host
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_gloo_two_processes_same_gradients(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for res in ranks:
        grads, bufs = res["plain"]
        for name in ("acts", "params"):
            g2, b2 = res[name]
            assert all(torch.equal(a, b) for a, b in zip(grads, g2)), name
            assert all(torch.equal(a, b) for a, b in zip(bufs, b2)), name
            assert res[name + "_swapped"] > 0
    # DDP averaged the gradients: both ranks hold the same ones.
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["acts"][0], ranks[1]["acts"][0]))
