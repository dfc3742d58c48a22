"""Trace a model into its aten-level joint forward+backward fx graph.

Path: ``torch.export.export(strict=False)`` (handles HF transformers models and records
``nn_module_stack``), then AOTAutograd's ``aot_export_joint_with_descriptors`` on the exported
module, which functionalizes (BatchNorm running stats become outputs), keeps dropout as a
traced ``native_dropout`` and tags every placeholder and output with a descriptor. Where the
export applies a custom ``torch.autograd.Function``, whose backward it drops, the joint is traced
from the model itself instead (`graph_capture.trace.autograd_functions`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.fx.traceback as fx_traceback
from torch import nn
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

from graph_capture.errors import CaptureError, data_dependence, first_lines
from graph_capture.trace.autograd_functions import (
    failing_function,
    module_stack,
    qualified,
    recording_functions,
    trace_with_functions,
)
from graph_capture.trace.dropout import dropout_as_eager_cpu
from graph_capture.trace.fx_nodes import describe_op
from graph_capture.trace.hf_masks import MaskGuard, masks_as_eager
from graph_capture.trace.lifted import LiftedConstant
from solver.errors import RematError


@dataclass
class TracedJoint:
    """The joint graph (flat positional codegen) and the descriptor of each placeholder/output;
    ``mask_guards``: the data-dependent decisions of HF's mask code the graph holds
    (`graph_capture.trace.hf_masks`)."""

    graph_module: torch.fx.GraphModule
    input_descs: list[object]
    output_descs: list[object]
    output_treespec: object
    mask_guards: tuple[MaskGuard, ...] = ()


def _check_model(model: nn.Module, inputs: Sequence[object], kwargs: Mapping[str, object]) -> None:
    if not any(p.requires_grad for p in model.parameters()):
        raise CaptureError(
            f"{type(model).__name__} has no parameters that require grad: there is no backward "
            "to schedule (set requires_grad on at least one parameter)"
        )
    named = [(f"example input {i}", x) for i, x in enumerate(inputs)]
    named += [(f"example keyword input '{k}'", x) for k, x in kwargs.items()]
    for what, x in named:
        if not isinstance(x, torch.Tensor):
            raise CaptureError(
                f"{what} is a {type(x).__name__}, not a tensor; pass tensors only "
                "(bind other arguments with functools.partial or a wrapper module)"
            )
    if not model.training:
        raise CaptureError(
            f"{type(model).__name__} is in eval mode; call model.train() to capture a training "
            "step (dropout and BatchNorm behave differently in eval)"
        )


def _register_cache_outputs(model: nn.Module) -> None:
    """Let torch.export flatten HF transformers' cache objects in a model's output.

    A causal LM called with its default config (``use_cache`` on) returns its key/value cache
    (``DynamicCache``, ``EncoderDecoderCache``) in the output; export needs every output to be
    a pytree of tensors. transformers ships the registration; this calls it for its models.
    """
    if not type(model).__module__.startswith("transformers."):
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # transformers < 5: export then fails on the cache (a CaptureError)
        return
    register_cache_pytrees_for_model(model)


@contextlib.contextmanager
def _quiet_failures() -> Iterator[None]:
    """What torch.export writes to stderr, held back while the model is exported and passed
    on only if the export succeeds; its symbolic-shape logger at ERROR meanwhile. On
    data-dependent control flow torch writes the partial graph and a warning there, beside the
    `CaptureError` that says what failed and where (the CLI's one line)."""
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        logger.setLevel(level)
    sys.stderr.write(held.getvalue())


def _export(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    kwargs: dict[str, torch.Tensor],
    values: tuple[Sequence[torch.Tensor], Mapping[str, torch.Tensor]],
) -> tuple[torch.fx.GraphModule, list[type], list[MaskGuard]]:
    """The exported module (sharing the model's state), the custom autograd.Functions the
    export applied to tensors that require grad (see `recording_functions`) and the guards of
    HF's data-dependent mask decisions, taken on ``values`` (`masks_as_eager`)."""
    _register_cache_outputs(model)
    with (
        module_stack(model) as stack,
        recording_functions() as functions,
        masks_as_eager(model, *values) as guards,
        _quiet_failures(),
    ):
        try:
            exported = torch.export.export(model, inputs, kwargs, strict=False)
        except Exception as error:
            if isinstance(error, RematError) and not isinstance(error, CaptureError):
                raise  # a runtime's refusal from inside the forward (fit's loss): as it is
            where = (stack[-1][0] if stack else "") or "(root)"
            culprit = failing_function(error, functions)
            inside = f" in custom autograd.Function {qualified(culprit)}" if culprit else ""
            raise CaptureError(
                f"torch.export failed in module '{where}'{inside} "
                f"(data-dependent control flow or an op that cannot be traced):\n  "
                f"{first_lines(error)}"
            ) from error
    for i, spec in enumerate(exported.graph_signature.output_specs):
        if spec.kind.name == "USER_OUTPUT" and not hasattr(spec.arg, "name"):
            raise CaptureError(
                f"forward output {i} is not a tensor ({spec.arg!r}); return tensors only"
            )
        if spec.kind.name == "USER_INPUT_MUTATION":
            raise CaptureError(
                f"the model mutates its input '{spec.target}' in place; the joint graph cannot "
                "replay that exactly: clone the input first"
            )
    return _share_state(exported.module(), model), functions, guards


def _share_state(exported: torch.fx.GraphModule, model: nn.Module) -> torch.fx.GraphModule:
    """Point the exported module at the model's own parameters and buffers, tied ones once.

    ``torch.export`` un-ties shared weights (one attribute per name) and AOTAutograd would
    lift each name as its own input with its own gradient. Reading every alias through the
    first name gives one placeholder per distinct tensor, whose gradient the traced backward
    accumulates over all uses exactly as eager autograd does.
    """
    canonical: dict[int, str] = {}
    alias_of: dict[str, str] = {}
    state = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in state:
        first = canonical.setdefault(id(tensor), name)
        prefix, _, attr = name.rpartition(".")
        owner = exported.get_submodule(prefix) if prefix else exported
        table = owner._parameters if isinstance(tensor, nn.Parameter) else owner._buffers
        if first == name:
            table[attr] = tensor
        else:
            alias_of[name] = first
            del table[attr]
    for node in exported.graph.find_nodes(op="get_attr"):
        node.target = alias_of.get(node.target, node.target)
    exported.recompile()
    return exported


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return (next(reversed(stack.values()))[0] or "(root)") if stack else "(root)"


def _modules_of_op(exported: torch.fx.GraphModule, error: BaseException) -> str:
    """ " at op X in module 'a'" for the op an AOTAutograd error points at, else ""."""
    text = str(error)
    executing = re.search(r"While executing %(\w+)", text)
    if executing:
        for node in exported.graph.nodes:
            if node.name == executing.group(1):
                return f" at op {node.target} in module '{_module_path(node)}'"
    match = re.search(r"output \d+ of (\w+?)(Backward\d*)?\b", text)
    if not match:
        return ""
    op = match.group(1).lower()
    modules = [
        _module_path(node)
        for node in exported.graph.nodes
        if node.op == "call_function"
        and getattr(node.target, "__name__", str(node.target)).split(".")[0].strip("_").lower()
        == op
    ]
    found = ", ".join(f"'{m}'" for m in dict.fromkeys(modules))
    return f" at op {op} in module {found}" if found else f" at op {op}"


def _views_as_reshapes(gm: torch.fx.GraphModule) -> None:
    """Run `aten.view` as `aten.reshape` (a view whenever a view is possible, else a copy).

    The joint graph is traced with fake tensors whose strides come from meta kernels; on CPU
    some eager kernels return other strides (BatchNorm1d's backward on a transposed input), and
    a `view` that was valid for the traced strides then fails. The values are the same either
    way, and the graph is functional, so nothing depends on the aliasing.
    """
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default):
        node.target = torch.ops.aten.reshape.default


def _constants_as_calls(gm: torch.fx.GraphModule) -> None:
    """Turn each ``get_attr`` of a lifted tensor constant into a call returning that tensor.

    ``torch.export`` lifts tensors the model creates from Python data (HF causal masks, T5's
    relative-position buckets) into constants, and the joint graph reads them with
    ``get_attr``. As a `LiftedConstant` call the graph stays call_function-only for the
    executor, and measurement counts the tensor as static memory, like a buffer.
    """
    for node in list(gm.graph.find_nodes(op="get_attr")):
        value = gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            raise CaptureError(
                f"the joint graph reads attribute '{node.target}' ({type(value).__name__}), not a "
                f"tensor, for {', '.join(describe_op(u) for u in node.users)}: a higher-order "
                "op that AOTAutograd did not inline is not supported"
            )
        node.op = "call_function"
        node.target = LiftedConstant(str(node.target), value)
        node.args, node.kwargs = (), {}


def trace_joint(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    kwargs: Mapping[str, torch.Tensor] | None = None,
    values: tuple[Sequence[torch.Tensor], Mapping[str, torch.Tensor]] | None = None,
) -> TracedJoint:
    """Trace ``model(*inputs, **kwargs)`` forward and backward into one functional aten graph.

    The joint's user inputs are ``inputs`` followed by the values of ``kwargs`` in its order.
    ``values``: the inputs' real values (positional, keyword) where ``inputs`` are fake (an
    estimate), for the decisions HF's mask code takes from data (`masks_as_eager`).
    Raises `CaptureError` naming the module and op on anything that would not replay exactly.
    """
    inputs = tuple(inputs)
    kwargs = dict(kwargs or {})
    _check_model(model, inputs, kwargs)
    exported, functions, guards = _export(model, inputs, kwargs, values or (inputs, kwargs))
    with contextlib.ExitStack() as stack:
        stack.enter_context(fx_traceback.preserve_node_meta())
        try:
            if functions:  # traced under the export's flags: HF builds its masks (no guards)
                joint = trace_with_functions(stack, model, inputs, kwargs, functions)
                guards = []
            else:
                joint = aot_export_joint_with_descriptors(
                    stack, exported, inputs, kwargs, _record_nn_module_stack=True
                )
        except CaptureError:
            raise
        except Exception as error:
            if reason := data_dependence(error):
                raise CaptureError(
                    f"data-dependent {reason}{_modules_of_op(exported, error)}: capture needs "
                    "static shapes; use a fixed-size form (torch.where, a mask multiply)"
                ) from error
            raise CaptureError(
                f"tracing the backward (AOTAutograd) failed{_modules_of_op(exported, error)}; "
                f"unsupported or mutating op?\n  {first_lines(error)}"
            ) from error
        gm = joint.graph_module
        treespec = joint.out_spec
    gm.graph._codegen = torch.fx.graph.CodeGen()
    _views_as_reshapes(gm)
    _constants_as_calls(gm)
    dropout_as_eager_cpu(gm)
    gm.recompile()
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    (output,) = gm.graph.find_nodes(op="output")
    return TracedJoint(
        graph_module=gm,
        input_descs=[p.meta["desc"] for p in placeholders],
        output_descs=list(output.meta["desc"]),
        output_treespec=treespec,
        mask_guards=tuple(guards),
    )
