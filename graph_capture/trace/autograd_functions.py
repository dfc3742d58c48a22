"""Custom ``torch.autograd.Function``s: found while the model is exported, traced with their
own backward.

``torch.export`` inlines a Function's forward and drops its backward, so a joint traced from
the exported module would differentiate the forward's formula instead (a straight-through
estimator's identity backward lost). When the export applies one to a tensor that requires
grad, the joint is traced from the model itself: AOTAutograd's ``make_fx`` runs the backward
through autograd, which calls the Function's own ``backward`` under tracing. Module hooks give
each forward node the ``nn_module_stack`` export would have recorded.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType

import torch
import torch.fx.traceback as fx_traceback
from torch import nn
from torch._export.utils import _compiling_state_context
from torch._functorch.aot_autograd import JointWithDescriptors, aot_export_joint_with_descriptors
from torch.utils._pytree import tree_leaves

from graph_capture.errors import CaptureError, first_lines

__all__ = [
    "failing_function",
    "module_stack",
    "qualified",
    "recording_functions",
    "trace_with_functions",
]


@contextlib.contextmanager
def module_stack(model: nn.Module, node_meta: bool = False) -> Iterator[list[tuple[str, str]]]:
    """Keep (path, qualified class) of the modules of ``model`` currently running, innermost
    last (path "" for the model itself). With ``node_meta``, also keep them as the
    ``nn_module_stack`` of the fx nodes traced meanwhile under ``preserve_node_meta``
    (``{path: (path, class)}``, outermost first, as ``torch.export`` records it; absent outside
    the model's forward)."""
    names = {id(m): name for name, m in model.named_modules()}
    stack: list[tuple[str, str]] = []

    def record() -> None:
        if not node_meta:
            return
        meta = fx_traceback.get_current_meta()
        if stack:
            meta["nn_module_stack"] = {path: (path, cls) for path, cls in stack}
        else:
            meta.pop("nn_module_stack", None)

    def push(module: nn.Module, args: object) -> None:
        if id(module) in names:
            stack.append((names[id(module)], qualified(type(module))))
            record()

    def pop(module: nn.Module, args: object, output: object) -> None:
        if id(module) in names and stack:
            stack.pop()
            record()

    handles = [
        nn.modules.module.register_module_forward_pre_hook(push),
        nn.modules.module.register_module_forward_hook(pop, always_call=True),
    ]
    try:
        yield stack
    finally:
        for handle in handles:
            handle.remove()


def qualified(cls: type) -> str:
    """ "package.module.Class" """
    return f"{cls.__module__}.{cls.__qualname__}"


@contextlib.contextmanager
def recording_functions() -> Iterator[list[type]]:
    """Record the custom ``torch.autograd.Function`` classes applied, while the block runs,
    to a tensor that requires grad with grad mode on (those whose backward a step runs), each
    once, in order of first use."""
    # A Python `classmethod` up to torch 2.13, a C `classmethod_descriptor` from 2.14: both
    # bind to a class through the descriptor protocol (`__get__(None, cls)`).
    original = torch.autograd.Function.__dict__["apply"]
    applied: list[type] = []

    def apply(cls: type, *args: object, **kwargs: object) -> object:
        if cls not in applied and torch.is_grad_enabled():
            leaves = tree_leaves((args, kwargs))
            if any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves):
                applied.append(cls)
        return original.__get__(None, cls)(*args, **kwargs)

    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield applied
    finally:
        torch.autograd.Function.apply = original


class _TiedOnce(nn.Module):
    """``model`` with each tied parameter or buffer listed once, under its first name.

    AOTAutograd lifts every name ``named_parameters(remove_duplicate=False)`` gives as its own
    input; listing a tied weight once and binding its other names to that input in the
    forward gives one placeholder, whose gradient sums over all uses as eager autograd's.
    The parameter and buffer tables are the model's own, so names and values are the model's.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.__dict__.update(
            _parameters=model._parameters, _buffers=model._buffers, _modules=model._modules
        )
        self.__dict__["model"] = model
        state = [
            *model.named_parameters(remove_duplicate=False),
            *model.named_buffers(remove_duplicate=False),
        ]
        first: dict[int, str] = {}
        for name, tensor in state:
            first.setdefault(id(tensor), name)
        self.aliases = {name: first[id(t)] for name, t in state if first[id(t)] != name}
        self.__dict__["listed"] = (list(model.named_parameters()), list(model.named_buffers()))
        self.training = model.training

    def named_parameters(self, *args: object, **kwargs: object) -> Iterator:
        return iter(self.listed[0])

    def named_buffers(self, *args: object, **kwargs: object) -> Iterator:
        return iter(self.listed[1])

    def forward(self, *args: object, **kwargs: object) -> object:
        model = self.model
        state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        tied = {alias: state[name] for alias, name in self.aliases.items()}
        return torch.func.functional_call(model, tied, args, kwargs, tie_weights=False)


def failing_function(error: BaseException, functions: Sequence[type]) -> type | None:
    """The Function among ``functions`` whose forward, setup_context or backward was running
    where ``error`` (or an exception it chains) was raised, else None."""
    by_name = {(cls.__module__, cls.__qualname__): cls for cls in functions}
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb: TracebackType | None = error.__traceback__
        found = None
        while tb is not None:
            code = tb.tb_frame.f_code
            owner, _, method = code.co_qualname.rpartition(".")
            module = tb.tb_frame.f_globals.get("__name__")
            if method in ("forward", "setup_context", "backward") and (module, owner) in by_name:
                found = by_name[(module, owner)]
            tb = tb.tb_next
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None


def trace_with_functions(
    stack: contextlib.ExitStack,
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    kwargs: Mapping[str, torch.Tensor],
    functions: Sequence[type],
) -> JointWithDescriptors:
    """The joint of ``model(*inputs, **kwargs)`` traced from the model itself (not its
    export), so that each of ``functions`` runs its own backward; ``stack`` as for
    ``aot_export_joint_with_descriptors``, with ``preserve_node_meta`` entered. Raises
    `CaptureError` naming the Function whose forward or backward cannot be traced, and
    re-raises other errors of the trace."""
    # the export's flags, so that the model takes the branches its export took (HF masks);
    # autograd's anomaly mode, on while AOTAutograd traces, warns of the error raised below
    with module_stack(model, node_meta=True), _compiling_state_context(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Error detected in", UserWarning)
        try:
            return aot_export_joint_with_descriptors(stack, _TiedOnce(model), inputs, kwargs)
        except Exception as error:
            culprit = failing_function(error, functions)
            if culprit is None:
                raise
            raise CaptureError(
                f"custom autograd.Function {qualified(culprit)} cannot be traced: its forward "
                "and backward must be torch operations on the tensors they get (no numpy round "
                "trip, .item() or Python branch on tensor values), as capture runs both under "
                "tracing and never substitutes the forward's derivative for its backward. "
                "Rewrite it so, or use executor.checkpoint_plan, which runs eager autograd."
                f"\n  {first_lines(error)}"
            ) from error
