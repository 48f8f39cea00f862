"""With swap_params: refuse a read of a parameter whose storage is in host memory.

Between its module's calls a swapped parameter keeps its tensor object but no device
storage (params.py). Code that reads it outside that module's forward (a tied head as
`h @ self.emb.weight.t()` in the parent's forward, a pre-hook of the root module) would
read freed memory: a bounds error deep in torch at best, a segfault (CPU) or a faulted
CUDA context at worst. A TorchFunctionMode sees each op's arguments before the op runs and
raises a one-line error naming the parameter and its module instead.

It costs a Python call per op, so it runs only on a forward whose signature (inputs'
shapes, training mode, ...: signature.py) has not been checked yet, up to
MAX_CHECKED signatures; code that reads a parameter outside its module only on some later
forward of an already-checked signature is not caught. Nor is a forward of a model holding
an nn.MultiheadAttention in eval mode (or any, under no_grad), a frozen encoder in a
training model included: its fast paths (and TransformerEncoderLayer's) are taken only
while no torch-function mode is active, so a guarded forward would round differently from
plain PyTorch and from the unguarded ones after it. Nor are reads made on another thread
(torch's mode stack is per thread), between the forward and its backward (an L2 term
summed over model.parameters()) or in the backward: those read freed memory.
"""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ..errors import OutcoreError

MAX_CHECKED = 64   # signatures checked per swap; variable shapes stop being checked after
_OWN = __name__.rpartition(".")[0]   # outcore.swap: its own moves of the parameters
# Ops that read a tensor's metadata, never its elements: allowed on a swapped-out parameter
# (a hook asking whether it is resident). "__get__"/"__set__": attributes (shape, grad,
# requires_grad, ...) but those in _ALIASES. So are ops that take only a tensor's shape,
# dtype or device (x.new_zeros(n), torch.zeros_like(p), len(p)).
_METADATA = frozenset({
    "__get__", "__set__", "size", "dim", "numel", "element_size", "stride", "storage_offset",
    "is_contiguous", "untyped_storage", "data_ptr", "nbytes", "itemsize", "is_floating_point",
    "is_complex", "is_pinned", "get_device", "__hash__", "register_hook", "retain_grad",
    "requires_grad_", "__len__", "nelement", "ndimension", "is_same_size", "is_set_to",
    "is_shared", "is_inference", "is_signed", "new_empty", "new_empty_strided", "new_zeros",
    "new_ones", "empty_like", "zeros_like", "ones_like", "rand_like", "randn_like",
    "randint_like"})
# Ops that read the elements of their first argument only, the others' metadata
# (x.type_as(p), x.to(p), x.expand_as(p)).
_FIRST_READ = frozenset({"type_as", "to", "expand_as", "view_as", "reshape_as"})
# Attributes that alias the elements (p.T, p.data): a read of them is a read of p; so is
# an assignment to p.data (from or to a swapped-out parameter).
_ALIASES = frozenset({"data", "T", "mT", "H", "mH"})
# Modules with an inference fast path that a torch-function mode turns off.
_FAST = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer,
         torch.nn.TransformerEncoder)


# The same refusal at a forward that compiled code runs (a torch.compile of the model made
# apart from the one swapped, or a compiled function calling it): refuse_compiled cannot
# see those up front.
COMPILED = ("outcore.swap(swap_params=True) cannot move the parameters of a model whose "
            "forward torch.compile'd code runs (a torch.compile of it made apart from the "
            "swapped model, or a compiled function calling it): compiled code reads "
            "parameters without the module hooks that fetch them: run the model uncompiled "
            "(torch.compiler.disable), or pass swap_params=False (saved activations still "
            "swap under torch.compile)")


def refuse_compiled(model: torch.nn.Module) -> None:
    """swap_params cannot serve a torch.compile'd module: its compiled code reads the
    parameters without running the module hooks that fetch them (it failed inside
    dynamo or inductor). Saved activations still swap under torch.compile."""
    for name, m in model.named_modules():
        compiled = (getattr(m, "_compiled_call_impl", None) is not None   # Module.compile()
                    or type(m).__module__.startswith("torch._dynamo"))   # torch.compile(m)
        if compiled:
            what = f"'{name}'" if name else f"the model ({type(model).__name__})"
            raise OutcoreError(f"outcore.swap(swap_params=True) cannot move the parameters "
                               f"of {what}: it is torch.compile'd, and compiled code reads "
                               "parameters without the module hooks that fetch them: leave "
                               "it uncompiled, or pass swap_params=False (saved activations "
                               "still swap under torch.compile)")


def compiled_caller() -> bool:
    """Is this forward run by torch.compile'd code (a compiled wrapper of the model made
    apart from it, which refuse_compiled cannot see)? Dynamo's frame callback is set then
    (torch's own test for "in a torch.compile region", torch._dynamo's set_stance)."""
    frames = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    get = getattr(frames, "get_eval_frame_callback", None)
    return torch.compiler.is_compiling() or (get is not None and get() not in (None, False))


def wanted(model: torch.nn.Module, checked: set, sig) -> bool:
    """Guard a forward of `sig` (signature.py) now? See the module docstring."""
    if sig in checked or len(checked) >= MAX_CHECKED:
        return False
    # Each such module decides on its own mode (a frozen encoder in eval under a training
    # model takes its fast path too)
    grad = torch.is_grad_enabled()
    if any(isinstance(m, _FAST) and not (m.training and grad) for m in model.modules()):
        return False
    checked.add(sig)
    return True


class ParamGuard(TorchFunctionMode):
    """Active for one forward: raises before any op reads a swapped-out parameter."""

    def __init__(self, swapper):
        super().__init__()
        self.swapper = swapper

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # The caller of the op: the swapper's own moves (resize_, copy_) of a parameter
        # not on the device are its business, not a misuse.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith(_OWN):
            what = getattr(func, "__name__", "")
            if what in ("__get__", "__set__"):   # an attribute: its name
                attr = getattr(getattr(func, "__self__", None), "__name__", "")
                if what == "__set__":   # p.data = t: undone by the next fetch of p
                    read = args if attr == "data" else ()
                    what = f".{attr} ="
                else:
                    read = args[:1] if attr in _ALIASES else ()
                    what = f".{attr}"
            elif what in _METADATA:
                read = ()
            elif what in _FIRST_READ:
                read = args[:1]
            else:
                read = tree_leaves((args, kwargs))
            slots = self.swapper.slots
            for t in read:
                s = slots.get(id(t)) if isinstance(t, torch.Tensor) else None
                if s is not None and s.param is t and not s.on_device:
                    raise OutcoreError(self._message(t, what or str(func)))
        return func(*args, **kwargs)

    def _message(self, p: torch.Tensor, what: str) -> str:
        model = self.swapper.model
        name = next((n for n, q in model.named_parameters(remove_duplicate=False) if q is p),
                    "a parameter")
        owners = [n or type(model).__name__ for n, m in model.named_modules()
                  if any(q is p for q in m.parameters(recurse=False))]
        return (f"outcore.swap(swap_params=True): {name} was read by {what} outside the "
                f"forward of {' / '.join(owners) or 'its module'}, which owns it (between "
                "that module's calls the parameter lives in host memory): read it only "
                "inside its module's forward (a tied head: an nn.Linear whose weight is the "
                "same Parameter), or pass swap_params=False")
