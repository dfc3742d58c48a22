"""A region's SAC policy: MUST_SAVE for the plan's saved ops, MUST_RECOMPUTE for the others, with
the plan's offloaded ops (saved ones) moved to the host and back (executor/sac/runtime/offload.py),
and the op-stream check (NOTE [ SAC policy state ], NOTE [ SAC plans under compile ] in
executor/sac/runtime/planned_forward.py). Used by `CheckpointPlan.apply` and by the recording, which
times it (`executor.sac.recording.overhead.measure_overhead`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.utils._pytree as pytree
from torch.utils.checkpoint import (
    CheckpointPolicy,
    _is_compiling,
    create_selective_checkpoint_contexts,
)

from executor.errors import OpStreamMismatchError, PlanError
from executor.sac.runtime.offload import CopyStreams, HostCopies, offloading_contexts


class Policy:
    """A block's SAC policy: MUST_SAVE for its saved ops, MUST_RECOMPUTE for the others, looked
    up by position in the block's forward op stream; `offloaded` (a subset of `saved`): the
    saved ops whose outputs wait on the host between the forward and the recompute, copied on
    `streams` (the plan's; a new `CopyStreams` by default). `contexts` is the `context_fn`: it
    makes a fresh position counter for each checkpoint call (NOTE [ SAC policy state ])."""

    def __init__(
        self,
        name: str,
        ops: Sequence[str],
        saved: frozenset[int],
        offloaded: frozenset[int] = frozenset(),
        streams: CopyStreams | None = None,
    ) -> None:
        self.name, self.ops, self.saved, self.offloaded = name, tuple(ops), saved, offloaded
        self.streams = CopyStreams() if streams is None else streams
        self.position = [0]
        self.saved_occurrences = {(ops[i], ops[:i].count(ops[i])) for i in saved}

    def contexts(self):
        # NOTE [ SAC policy state ]: torch calls the policy in the forward only, and a recompute
        # finds values by op and occurrence index, so the counter lives per checkpoint call.
        position = self.position = [0]
        occurrences: dict[str, int] = {}
        copies = HostCopies(self.streams)  # the offloaded outputs (executor/sac/runtime/offload.py)

        def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
            if _tracing(op, args, kwargs):
                if self.offloaded:
                    raise PlanError(
                        f"block {self.name}'s SAC plan offloads ops, which torch.compile "
                        "cannot run in torch 2.13 (nothing maps MUST_CPU_OFFLOAD to its "
                        "offloading pass): solve the plan without offload= for compiled use"
                    )
                # NOTE [ SAC plans under compile ]: the partitioner sees traced ops, not eager's
                # stream; the plan's saved ops are found by op and occurrence (SAC's own key).
                k = occurrences[str(op)] = occurrences.get(str(op), -1) + 1
                saved = (str(op), k) in self.saved_occurrences
                return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.MUST_RECOMPUTE
            i = position[0]
            position[0] += 1
            if i >= len(self.ops) or str(op) != self.ops[i]:
                planned = self.ops[i] if i < len(self.ops) else "no op (its stream ended)"
                raise OpStreamMismatchError(
                    f"block {self.name} dispatched {op} at op {i} where its SAC plan has "
                    f"{planned}: the block runs other ops than when the plan was solved "
                    "(code, autocast or dtype changed); solve the plan again"
                )
            if i in self.offloaded:
                copies.pack(op, args, ctx.op_output)
            return (
                CheckpointPolicy.MUST_SAVE if i in self.saved else CheckpointPolicy.MUST_RECOMPUTE
            )

        forward, recompute = create_selective_checkpoint_contexts(policy)
        if not self.offloaded or torch.compiler.is_compiling():
            return forward, recompute
        return offloading_contexts(forward, recompute, copies)

    def check_complete(self) -> None:
        if torch.compiler.is_compiling() or _faked():
            return  # NOTE [ SAC plans under compile ]
        if self.position[0] != len(self.ops):
            raise OpStreamMismatchError(
                f"block {self.name} dispatched {self.position[0]} ops where its SAC plan has "
                f"{len(self.ops)} (the next planned op is {self.ops[self.position[0]]}): solve "
                "the plan again"
            )


def _faked() -> bool:
    """Whether a FakeTensorMode is active (every tensor made is fake)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def _tracing(op, args, kwargs) -> bool:
    """Whether the op is being traced (torch.compile's AOT tracing or dynamo's fake-tensor
    runs, or any step under a FakeTensorMode, such as estimate mode's reserved bytes), not run
    eagerly: a factory op has no fake argument, and the active fake mode tells."""
    from torch._subclasses.fake_tensor import FakeTensor

    if _is_compiling(op, args, kwargs) or torch.compiler.is_compiling():
        return True
    if _faked():
        return True
    return any(isinstance(a, FakeTensor) for a in pytree.tree_leaves((args, kwargs)))


def contexts_of(policy: Policy):
    return policy.contexts()
