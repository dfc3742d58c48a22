"""HF transformers' attention masks, traced as eager decides them.

Called eagerly with SDPA attention and no padding, an HF decoder leaves the causal mask out:
``scaled_dot_product_attention`` runs with ``is_causal=True`` and, with fewer key/value heads
than query heads, ``enable_gqa=True`` (`transformers.masking_utils._ignore_causal_mask_sdpa`,
`transformers.integrations.sdpa_attention.use_gqa_in_sdpa`). Under ``torch.export`` the same
code always builds the mask (an exported graph must stay valid for other inputs) and repeats
the key/value heads (``repeat_kv``), because ``enable_gqa`` is taken only without a mask. The
values agree, the bits do not: the CPU flash-attention backward sums the key/value gradients of
a head group inside the kernel with ``enable_gqa``, the repeated heads' gradients are summed by
the ``expand``'s backward in another order (a Llama with 4 query heads over 1 key/value head,
64 tokens: parameter gradients 1e-7 to 5e-7 apart, relative, in float32, 5e-3 to 8e-3 in
bfloat16).

A captured graph is specialised to its example anyway (shapes, and `executor.traced.checks`
refuses other ones), so the capture lets transformers decide as in eager, on the example's
values (`masks_as_eager`):

- its mask functions do not see the export (``is_torchdynamo_exporting``);
- each decision transformers takes from tensor data, which the export would answer without
  reading it (`DECISIONS`: is a token padded, are sequences packed), is taken on real values:
  the traced tensor it reads is recomputed from the example inputs it depends on (the ops
  traced so far that lead from those inputs to it) and HF's own function answers on that.

A decision that reads no input (the position ids a Llama called with ``use_cache=False``
makes with ``arange``) holds for every step. One that reads inputs (an ``attention_mask``)
becomes a `MaskGuard`: each step recomputes it from the step's inputs, and a step on which eager
would take the other branch is refused (`executor.traced.checks.check_inputs`). Where the value
cannot be recomputed (it reads a parameter, or the example is fake or on the meta device), the
decision is left to the export, as transformers makes it there: the mask is built.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType

import torch
from torch import nn
from torch.fx.experimental import proxy_tensor
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["DECISIONS", "MaskGuard", "masks_as_eager"]

InputKey = int | str
"""A user input: its position among the positional inputs, or its keyword."""

DECISIONS: dict[str, tuple[str, str]] = {
    "_ignore_causal_mask_sdpa": (
        "leaves the causal mask out (no padded token: SDPA with is_causal)",
        "builds the causal mask (a padded token)",
    ),
    "_ignore_bidirectional_mask_sdpa": (
        "leaves the attention mask out (no padded token)",
        "builds the attention mask (a padded token)",
    ),
    "find_packed_sequence_indices": (
        "finds no packed sequences in the position ids",
        "masks packed sequences (position ids that restart)",
    ),
}
"""transformers.masking_utils' functions that decide from tensor data, each with what eager
then does when it answers True and when False (for `find_packed_sequence_indices`: True where
it finds no packed sequence, None)."""


@dataclass(frozen=True)
class MaskGuard:
    """One of transformers' data-dependent mask decisions (`DECISIONS`), as the capture took it.

    ``reads``: the user inputs the decision depends on; ``value``: from those inputs (in that
    order), the tensor it reads; ``decide``: HF's answer on that tensor, with the capture's
    other arguments; ``taken``: the answer on the example inputs, the branch the graph holds."""

    function: str
    reads: tuple[InputKey, ...]
    value: torch.fx.GraphModule = field(repr=False)
    decide: Callable[[torch.Tensor], bool] = field(repr=False)
    taken: bool

    def mismatch(self, inputs: Sequence[torch.Tensor], kwargs: Mapping[str, torch.Tensor]) -> str:
        """Why a step on these inputs may not run the captured graph ("" where it may: eager
        decides as on the example)."""
        args = [inputs[k] if isinstance(k, int) else kwargs[k] for k in self.reads]
        with torch.no_grad():
            now = self.decide(self.value(*args))
        if now == self.taken:
            return ""
        names = " and ".join(
            f"input {k}" if isinstance(k, int) else f"keyword input '{k}'" for k in self.reads
        )
        branch = DECISIONS[self.function]
        return (
            f"{names}: on this step's values eager transformers {branch[not now]}, but the graph "
            f"was captured on values where it {branch[not self.taken]} and computes only that "
            "way; capture (rematerialize) with example inputs like this step's"
        )


@contextlib.contextmanager
def masks_as_eager(
    model: nn.Module,
    inputs: Sequence[object] = (),
    kwargs: Mapping[str, object] | None = None,
) -> Iterator[list[MaskGuard]]:
    """Within it, transformers' mask functions see no export and take their data-dependent
    decisions on the real example ``inputs`` and ``kwargs`` (module docstring); yields the list
    that holds, once the export is done, a `MaskGuard` per decision that read an input. A no-op
    for a model not from transformers, or a transformers without ``masking_utils``."""
    masking = sys.modules.get("transformers.masking_utils")
    guards: list[MaskGuard] = []
    if not type(model).__module__.startswith("transformers.") or masking is None:
        yield guards
        return
    exporting = getattr(masking, "is_torchdynamo_exporting", None)
    if exporting is None:
        yield guards
        return
    examples: dict[InputKey, object] = {**dict(enumerate(inputs)), **(kwargs or {})}
    seen: dict[InputKey, torch.Tensor] = {}  # the tensors the traced forward got, by input

    def record(_module: nn.Module, args: tuple, keywords: dict) -> None:
        seen.clear()
        for key, x in [*enumerate(args), *keywords.items()]:
            if isinstance(x, torch.Tensor):
                seen[key] = x

    originals = {name: getattr(masking, name, None) for name in DECISIONS}
    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    masking.is_torchdynamo_exporting = lambda: False
    for name, original in originals.items():
        if original is not None:
            setattr(masking, name, _deciding(masking, name, original, seen, examples, guards))
    try:
        yield guards
    finally:
        hook.remove()
        masking.is_torchdynamo_exporting = exporting
        for name, original in originals.items():
            if original is not None:
                setattr(masking, name, original)
        seen.clear()


def _deciding(
    masking: ModuleType,
    name: str,
    original: Callable,
    seen: Mapping[InputKey, torch.Tensor],
    examples: Mapping[InputKey, object],
    guards: list[MaskGuard],
) -> Callable:
    """``original`` (a `DECISIONS` function), answering on the real value of the traced tensor
    it reads where that can be recomputed from the example inputs; a `MaskGuard` appended to
    ``guards`` for a decision that read inputs."""

    @functools.wraps(original)
    def decided(tensor: object, *args: object, **kwargs: object) -> object:
        others = [*args, *kwargs.values()]
        if not _fake(tensor) or any(isinstance(x, torch.Tensor) for x in others):
            return original(tensor, *args, **kwargs)
        traced = _recomputed(tensor, seen)
        if traced is None:
            return original(tensor, *args, **kwargs)
        reads, value = traced
        real = [examples.get(k) for k in reads]
        if not all(isinstance(x, torch.Tensor) and _real(x) for x in real):
            return original(tensor, *args, **kwargs)
        decide = functools.partial(_decide, name, original, args, kwargs)
        with _untraced(masking):
            taken = decide(value(*real))
        if reads:
            guards.append(MaskGuard(name, reads, value, decide, taken))
        if name == "find_packed_sequence_indices":
            return None if taken else original(tensor, *args, **kwargs)
        return taken

    return decided


def _decide(name: str, original: Callable, args: tuple, kwargs: dict, value: torch.Tensor) -> bool:
    """HF's answer (`DECISIONS`) on a real tensor."""
    answer = original(value, *args, **kwargs)
    if name == "find_packed_sequence_indices":
        return answer is None
    return bool(answer)


def _fake(x: object) -> bool:
    return isinstance(x, torch._subclasses.FakeTensor)


def _real(x: torch.Tensor) -> bool:
    return not _fake(x) and x.device.type != "meta"


@contextlib.contextmanager
def _untraced(masking: ModuleType) -> Iterator[None]:
    """Real tensors computed as in eager while the export traces: its fake and proxy modes and
    torch-function handlers off, and transformers' ``is_tracing`` false (it reads
    ``torch.compiler.is_compiling``, true during the export)."""
    tracing = masking.is_tracing
    masking.is_tracing = lambda tensor=None: False
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
            yield
    finally:
        masking.is_tracing = tracing


def _recomputed(
    tensor: torch.Tensor, seen: Mapping[InputKey, torch.Tensor]
) -> tuple[tuple[InputKey, ...], torch.fx.GraphModule] | None:
    """The user inputs ``tensor`` depends on and a module computing it from them: the ops the
    export traced so far that lead to it, copied. None where it is not traced, or depends on
    something other than user inputs (a parameter, a buffer, a lifted constant)."""
    mode = proxy_tensor.get_proxy_mode()
    if mode is None:
        return None
    tracer = mode.tracer
    slot = proxy_tensor.get_proxy_slot(tensor, tracer, None)
    if slot is None:
        return None
    target = slot.proxy.node
    placeholders = {}
    for key, x in seen.items():
        traced = proxy_tensor.get_proxy_slot(x, tracer, None)
        if traced is not None:
            placeholders[traced.proxy.node] = key
    needed: set[torch.fx.Node] = set()
    stack = [target]
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        if node.op == "placeholder" and node not in placeholders:
            return None
        if node.op not in ("placeholder", "call_function"):
            return None
        needed.add(node)
        stack.extend(node.all_input_nodes)
    graph = torch.fx.Graph()
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    reads: list[InputKey] = []
    for node in target.graph.nodes:
        if node not in needed:
            continue
        if node.op == "placeholder":
            copied[node] = graph.placeholder(f"input_{len(reads)}")
            reads.append(placeholders[node])
        else:
            copied[node] = graph.node_copy(node, copied.__getitem__)
            copied[node].meta = {}
    graph.output(copied[target])
    return tuple(reads), torch.fx.GraphModule(nn.Module(), graph)
