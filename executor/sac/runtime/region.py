"""How a region runs inside `torch.utils.checkpoint`, at runtime (`executor.sac`) and in the
recording (`executor.sac.recording.record`, `executor.sac.recording.op_streams`,
`executor.sac.recording.overhead`) alike:

- `cache_off`: a region that runs inside checkpoint gets HuggingFace's KV cache off, as under
  HF's own gradient checkpointing (`GradientCheckpointingLayer`): `use_cache=True` becomes
  False and every `transformers.Cache` argument None, with a warning once; the forward and the
  recompute would otherwise update the cache twice. The recording runs every candidate region
  with the same arguments (`cache_off_hooks`), so its op streams are the runtime's.
- `run_checkpointed`: the region's forward inside `checkpoint(use_reentrant=False)`, the
  recompute seeing the containers (lists, dicts, tuples) the forward saw, rebuilt from the
  leaves at the call (a caller appending to a list argument after the call, as DenseNet's
  blocks do, does not change the recompute), and the buffers the forward mutates
  (BatchNorm's running statistics) restored around the recompute: their values before the
  forward while it runs (so a module reading its own state recomputes the same values), their
  values from before the recompute after it (so the step updates them once, as eagerly).
- `buffer_state`, `mutated_buffers`: which buffers a forward mutates, recorded with the plan
  (`SacBlock.buffers`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

from executor.sac.runtime.policy import Policy, contexts_of

logger = logging.getLogger(__name__)


def _is_cache(value: object) -> bool:
    """Whether `value` is a HuggingFace KV cache (`transformers.cache_utils.Cache`)."""
    module = sys.modules.get("transformers.cache_utils")
    return module is not None and isinstance(value, module.Cache)


@functools.cache
def _warn_once(kind: str) -> None:
    logger.warning(
        "Caching is incompatible with checkpointing in %s: a SAC plan runs it with "
        "`use_cache=False` and its cache arguments None (as HF's gradient checkpointing does)",
        kind,
    )


def cache_off(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`args`, `kwargs` with HuggingFace's KV cache off where the region will run inside
    checkpoint (grad enabled): `use_cache` False, each `Cache` argument None."""
    if not torch.is_grad_enabled():
        return args, kwargs
    changed = any(_is_cache(a) for a in args) or any(_is_cache(v) for v in kwargs.values())
    if kwargs.get("use_cache"):
        kwargs = {**kwargs, "use_cache": False}
        changed = True
    if not changed:
        return args, kwargs
    _warn_once(type(module).__name__)
    args = tuple(None if _is_cache(a) else a for a in args)
    return args, {k: None if _is_cache(v) else v for k, v in kwargs.items()}


def cache_off_hooks(regions: Iterable[nn.Module]) -> list[RemovableHandle]:
    """Forward pre-hooks running `cache_off` on each region's arguments (for the recording)."""
    return [
        m.register_forward_pre_hook(lambda m, a, k: cache_off(m, a, k), with_kwargs=True)
        for m in regions
    ]


def buffer_state(module: nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    """Each buffer's `_version` counter and a copy of its value, by name relative to
    `module`."""
    with torch.no_grad():
        return {n: (b._version, b.clone()) for n, b in module.named_buffers()}


def mutated_buffers(
    module: nn.Module,
    before: dict[str, tuple[int, torch.Tensor]],
    changed: Callable[[torch.Tensor, torch.Tensor], bool] | None = None,
) -> list[str]:
    """The buffers of `module` changed since `before` (`buffer_state`): by version counter or,
    where a kernel writes a buffer its schema does not mark as written (`native_batch_norm`'s
    running statistics, whose counters stay), by `changed(buffer, copy before)` (by value;
    `Measurer.changed`)."""
    changed = changed or (lambda b, copy: not torch.equal(b, copy))
    return [
        n
        for n, b in module.named_buffers()
        if n not in before or b._version != before[n][0] or changed(b, before[n][1])
    ]


class _Restored:
    """The recompute context: the buffers' values from before the forward while `inner` (the
    policy's recompute mode, entered inside) runs, their values from before it after it; it
    is entered once per recompute and leaves an exception (the early stop) to propagate."""

    def __init__(self, inner, buffers: list[torch.Tensor], before: list[torch.Tensor]) -> None:
        self.inner, self.buffers, self.before = inner, buffers, before
        self.current: list[torch.Tensor] = []

    def __enter__(self) -> None:
        with torch.no_grad():
            self.current = [b.clone() for b in self.buffers]
            torch._foreach_copy_(self.buffers, self.before)
        self.inner.__enter__()

    def __exit__(self, *exc) -> bool:
        try:
            self.inner.__exit__(*exc)
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.buffers, self.current)
            self.current = []
        return False


def run_checkpointed(
    module: nn.Module,
    args: Sequence[object],
    kwargs: dict[str, object],
    policy: Policy | None,
    buffers: Sequence[str] = (),
) -> object:
    """The region's forward (its class's) inside `checkpoint(use_reentrant=False)` under
    `policy` (None: plain checkpoint), with its containers and the buffers named in `buffers`
    (mutated by its forward) handled as the module docstring says."""
    forward = type(module).forward.__get__(module)
    if torch.compiler.is_compiling():
        # NOTE [ SAC plans under compile ]: the policy's modes only; AOTAutograd functionalizes
        # buffer updates and applies them once, and dynamo traces the call's containers
        contexts = {} if policy is None else {"context_fn": functools.partial(contexts_of, policy)}
        return checkpoint(forward, *args, use_reentrant=False, **contexts, **kwargs)
    named = dict(module.named_buffers())
    tensors = [named[n] for n in buffers]
    with torch.no_grad():
        before = [b.clone() for b in tensors]
    leaves, spec = pytree.tree_flatten((tuple(args), kwargs))
    calls = [(tuple(args), kwargs)]  # the forward gets the caller's own containers

    def run(*flat):
        a, k = calls.pop() if calls else pytree.tree_unflatten(list(flat), spec)
        return forward(*a, **k)

    def contexts():
        if policy is None:
            return contextlib.nullcontext(), _Restored(contextlib.nullcontext(), tensors, before)
        forward_mode, recompute_mode = policy.contexts()
        return forward_mode, _Restored(
            recompute_mode, tensors, before
        ) if tensors else recompute_mode

    extra = {"context_fn": contexts} if policy is not None or tensors else {}
    out = checkpoint(run, *leaves, use_reentrant=False, **extra)
    if policy is not None:
        policy.check_complete()
    return out
