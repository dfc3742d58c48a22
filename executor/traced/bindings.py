"""torch's own Python bindings for the aten calls of generated schedule code.

An `OpOverload` called through its `_op` goes through the JIT's generic argument parsing
(about 4 us per call on a 2-core CPU); torch's generated bindings (``torch.mm``,
``Tensor.view``, ``torch._C._nn.*``) parse the same arguments in about 2.5 us and hand the same
overload to the dispatcher. On BERT-4's step (826 fx nodes) that difference was most of the
executor's time above eager's (`python -m benchmarks.running.real_models` measures it as "remat
100%"
against "eager"). Backward kernels (``gelu_backward``, ``native_layer_norm_backward``...) have
no such binding and keep `_op`.

A binding is used for an fx node only when it makes exactly the call the node's own target
makes: `binding_for` runs both on meta tensors shaped like the node's inputs (no data, no
kernels) under a dispatch mode that records every call reaching the dispatcher, and accepts the
binding only if both record one call, of the node's overload, with equal arguments (the input
tensors themselves, and every other argument equal in type and value). Anything else (no
binding of that name, a binding that resolves to another overload, a composite that
decomposes, an input without a traced shape) keeps `_op`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["binding_for", "bindings"]

_NAMESPACES: tuple[object, ...] = (
    torch._C._VariableFunctions,
    torch._C._nn,
    torch._C.TensorBase,
)
"""Where torch's generated bindings live: ``torch.*`` functions, ``torch.nn.functional``'s
kernels, Tensor methods (called unbound, the tensor first)."""


class _Record(TorchDispatchMode):
    """Records (overload, args, kwargs) of every call that reaches the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, tuple[object, ...], dict[str, object]]] = []

    def __torch_dispatch__(
        self, func: object, types: object, args: tuple = (), kwargs: dict | None = None
    ) -> object:
        self.calls.append((func, tuple(args), dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


def bindings(nodes: Iterable[torch.fx.Node]) -> dict[torch.fx.Node, Callable[..., object]]:
    """`binding_for` of each node that has one; nodes making the same call (the same target on
    inputs of the same shapes, strides and dtypes, the same other arguments, as a transformer's
    repeated layers do) are checked once."""
    found: dict[torch.fx.Node, Callable[..., object]] = {}
    checked: dict[Hashable, Callable[..., object] | None] = {}
    for node in nodes:
        key = _call_key(node)
        if key is None:
            binding = binding_for(node)
        elif key in checked:
            binding = checked[key]
        else:
            binding = checked[key] = binding_for(node)
        if binding is not None:
            found[node] = binding
    return found


def binding_for(node: torch.fx.Node) -> Callable[..., object] | None:
    """A binding that makes the same dispatcher call as ``node.target``, or None."""
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet is None:
        return None
    inputs = _meta_inputs(node)
    if inputs is None:
        return None
    own = _recorded(getattr(target, "_op", target), node, inputs)
    if own is None or len(own) != 1 or own[0][0] is not target:
        return None
    name = packet.__name__
    for namespace in _NAMESPACES:
        candidate = getattr(namespace, name, None)
        if candidate is None:
            continue
        calls = _recorded(candidate, node, inputs)
        if calls is not None and len(calls) == 1 and _same_call(calls[0], own[0]):
            return candidate
    return None


def _call_key(node: torch.fx.Node) -> Hashable | None:
    """What `binding_for`'s answer depends on, hashable; None where an argument is not."""

    def key(value: object) -> Hashable:
        if isinstance(value, torch.fx.Node):
            val = value.meta.get("val")
            if isinstance(val, torch.Tensor):
                return ("tensor", tuple(val.shape), val.stride(), val.dtype)
            return ("value", type(val), val)
        if isinstance(value, list | tuple):
            return (type(value), tuple(key(v) for v in value))
        if isinstance(value, dict):
            return (dict, tuple((k, key(v)) for k, v in value.items()))
        return (type(value), value)

    try:
        signature = (node.target, key(node.args), key(node.kwargs))
        hash(signature)
    except TypeError:
        return None
    return signature


def _meta_inputs(node: torch.fx.Node) -> dict[torch.fx.Node, object] | None:
    """A meta tensor (or the traced value, for non-tensors) per fx input, None if untraced."""
    inputs: dict[torch.fx.Node, object] = {}
    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            inputs[arg] = torch.empty_strided(
                val.shape, val.stride(), dtype=val.dtype, device="meta"
            )
        elif isinstance(val, bool | int | float):
            inputs[arg] = val
        else:
            return None
    return inputs


def _recorded(
    call: Callable[..., object], node: torch.fx.Node, inputs: dict[torch.fx.Node, object]
) -> list[tuple[object, tuple[object, ...], dict[str, object]]] | None:
    args = torch.fx.node.map_arg(node.args, inputs.__getitem__)
    kwargs = torch.fx.node.map_arg(node.kwargs, inputs.__getitem__)
    record = _Record()
    try:
        with record, torch.no_grad():
            call(*args, **kwargs)
    except Exception:  # a binding that does not take these arguments is simply not used
        return None
    return record.calls


def _same_call(
    a: tuple[object, tuple[object, ...], dict[str, object]],
    b: tuple[object, tuple[object, ...], dict[str, object]],
) -> bool:
    return a[0] is b[0] and _same(a[1], b[1]) and _same(a[2], b[2])


def _same(a: object, b: object) -> bool:
    """Equal as dispatcher arguments: tensors identical, containers elementwise, the rest equal
    in type and value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b
