"""Find a model's repeated blocks and split its parameters into streaming groups.

A model is seen as `rest` (everything outside the blocks: embeddings, final norm, head)
plus N blocks, each an entry of one nn.ModuleList / nn.Sequential that holds parameters
(an entry without any runs as part of `rest`). Group 0 is `rest`; groups 1..N are the
blocks. The model's code is never changed: the engine only swaps a block's `forward` for
the duration of a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import OutcoreError

# Where the Hugging Face families keep their decoder layers.
_KNOWN_PATHS = ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers",
                "transformer.layers", "layers", "blocks", "h")


@dataclass
class Group:
    """One unit of streaming: the parameters of one block (or of `rest`).

    names:  qualified parameter names in the user's model (one per distinct Parameter)
    params: the Parameter objects, same order; shapes define the flat layout
    offsets: start of each parameter in the group's flat buffer (elements)
    shapes: each parameter's shape when the group was built (the layout's; a user may
            rebind p.data later: HostState.adopt_rebound)
    numel:  total elements of the flat buffer
    """

    index: int
    name: str
    module: nn.Module | None
    names: list[str] = field(default_factory=list)
    params: list[nn.Parameter] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    shapes: list[torch.Size] = field(default_factory=list)
    numel: int = 0

    def add(self, name: str, p: nn.Parameter) -> None:
        self.names.append(name)
        self.params.append(p)
        self.offsets.append(self.numel)
        self.shapes.append(p.shape)
        self.numel += p.numel()


def _get(model: nn.Module, path: str):
    obj = model
    for part in path.split("."):
        if not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return obj


def find_blocks(model: nn.Module, blocks: str | None) -> tuple[str, nn.Module]:
    """Return (path, container) of the ModuleList/Sequential whose entries are streamed.

    `blocks` names it ("model.layers"); None searches the Hugging Face paths, then the
    model itself if it is an nn.Sequential, then the ModuleList holding most parameters.
    """
    def ok(c) -> bool:
        return isinstance(c, (nn.ModuleList, nn.Sequential)) and len(c) > 0

    if blocks is not None:
        if not isinstance(blocks, str):
            raise TypeError(f"blocks={blocks!r} must be the attribute path of the repeated "
                            "layers as a string, such as 'model.layers', or None")
        c = model if blocks in ("", ".") else _get(model, blocks)
        if not ok(c):
            raise OutcoreError(
                f"blocks={blocks!r} does not name a non-empty nn.ModuleList or nn.Sequential "
                f"of {type(model).__name__}: pass the attribute path of its repeated layers")
        return blocks, c
    for path in _KNOWN_PATHS:
        c = _get(model, path)
        if ok(c) and len(c) > 1:
            return path, c
    if ok(model):
        return "", model
    best, best_n = None, 0
    for name, mod in model.named_modules():
        if ok(mod) and len(mod) > 1:
            n = sum(p.numel() for p in mod.parameters())
            if n > best_n:
                best, best_n = name, n
    if best is None:
        # A model of a single block (an HF config with num_hidden_layers=1): its list of
        # one, where nothing longer exists (refused before as having no list at all).
        best = next((p for p in _KNOWN_PATHS if ok(_get(model, p))), None)
    if best is None:
        for name, mod in model.named_modules():
            if ok(mod) and name and any(True for _ in mod.parameters()):
                n = sum(p.numel() for p in mod.parameters())
                if n > best_n:
                    best, best_n = name, n
    if best is None:
        raise OutcoreError(
            f"cannot split {type(model).__name__} into blocks: it has no nn.ModuleList or "
            "nn.Sequential of layers; pass blocks='path.to.layers' or wrap the layers in an "
            "nn.ModuleList")
    return best, _get(model, best) if best else model


def build_groups(model: nn.Module, path: str, container: nn.Module) -> list[Group]:
    """Split the model's distinct parameters into [rest, block 0, block 1, ...].

    A Parameter shared between places (tied weights) belongs to the group that holds it;
    one shared across a block's edge (with `rest` or another block) is refused.
    """
    prefix = f"{path}." if path else ""
    block_of: dict[str, int] = {}
    for i, (cname, _) in enumerate(container.named_children()):
        block_of[f"{prefix}{cname}."] = i
    rest = Group(0, "rest", None)
    blocks = [Group(i + 1, f"{prefix}{cname}", m)
              for i, (cname, m) in enumerate(container.named_children())]
    owner: dict[int, Group] = {}
    all_params = list(model.named_parameters(remove_duplicate=False))
    # A tensor that appears both in a block and outside the blocks must live in rest.
    outside = {id(p) for n, p in all_params if not any(n.startswith(k) for k in block_of)}
    in_blocks: dict[int, set[int]] = {}
    for n, p in all_params:
        for k, i in block_of.items():
            if n.startswith(k):
                in_blocks.setdefault(id(p), set()).add(i)
    for n, p in all_params:
        if id(p) in owner:
            continue
        where = in_blocks.get(id(p), set())
        if where and (id(p) in outside or len(where) > 1):
            # A block's backward recomputes it with its own parameters only: the other
            # place's use of the tensor would get no gradient (measured: wrong weights).
            names = [m for m, q in all_params if q is p]
            raise OutcoreError(
                f"parameter {names[0]!r} is shared with {names[1]!r}, across the edge of a "
                "streamed block: untie them, or pass blocks= so the sharing stays outside "
                "the blocks (tied embeddings and head are fine)")
        g = rest if not where else blocks[next(iter(where))]
        owner[id(p)] = g
        g.add(n, p)
    # An entry without parameters (Flatten, an activation, Dropout) has nothing to stream:
    # it runs as the model's own code, in rest's graph. Streamed, one before the first
    # parameter had no input needing a gradient and no weight: its backward called
    # autograd.grad on nothing (a RuntimeError for nn.Sequential(nn.Flatten(), ...)).
    blocks = [b for b in blocks if b.names]
    for i, b in enumerate(blocks):
        b.index = i + 1
    return [rest] + blocks
