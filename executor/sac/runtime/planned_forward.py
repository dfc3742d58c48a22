"""The forwards `CheckpointPlan.apply` binds to a plan's regions: `checkpointed_forward` for a
region that runs inside a checkpoint, `offloading_forward` for one that is not checkpointed and
whose saved storages wait on the host.

NOTE [ SAC plans under compile ]: while torch.compile traces a block (dynamo's fake-tensor runs,
AOTAutograd's joint trace), the policy sees traced ops, not eager's dispatched stream (views
differ, dropout is functional), so positions mean nothing there. It then marks the plan's
MUST_SAVE ops by op and occurrence among ops of that name (SAC's own cache key) and every other
op MUST_RECOMPUTE, which the min-cut partitioner honours; the op-stream check runs eagerly only.
"""

from __future__ import annotations

import torch
from torch import nn

from executor.sac.runtime.offload import SavedOnHost
from executor.sac.runtime.policy import Policy
from executor.sac.runtime.region import cache_off, run_checkpointed
from executor.sac.step import leaf_tensors


def checkpointed_forward(module: nn.Module, *args: object, **kwargs: object) -> object:
    """A planned block's `forward`: its class's forward inside `checkpoint(use_reentrant=False)`
    with the block's policy (`executor.sac.runtime.region.run_checkpointed`: the KV cache off, the
    recompute seeing the call's containers, the buffers its forward mutates restored around
    the recompute). A region that saves no op runs without a policy (plain checkpoint: no
    dispatch modes, no op-stream check, the same recompute and early stop), except while
    torch.compile traces it, where the policy marks every op MUST_RECOMPUTE for the
    partitioner; so does a region in eval mode (its op stream is training mode's in the plan:
    BatchNorm and dropout dispatch other ops in eval). Without grad (`torch.no_grad`,
    `torch.inference_mode`) there is no backward: the plain forward runs. Bound to the module
    (`types.MethodType`), so a deep copy of the model runs the copy's own forward and
    policy."""
    forward = type(module).forward.__get__(module)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    policy: Policy = module.remat_sac_policy
    args, kwargs = cache_off(module, args, kwargs)
    planned = module.training and (policy.saved or torch.compiler.is_compiling())
    return run_checkpointed(
        module, args, kwargs, policy if planned else None, module.remat_sac_buffers
    )


@torch.compiler.disable
def offloading_forward(module: nn.Module, *args: object, **kwargs: object) -> object:
    """A region's `forward` where it is not checkpointed and its saved storages wait on the host
    (NOTE [ SAC offload model ]): its class's forward under `SavedOnHost`'s
    `saved_tensors_hooks`, copying on the plan's `CopyStreams` (`module.remat_sac_offload`),
    HF's KV cache off as in the recording (`cache_off`); without grad or in eval mode, the
    plain forward. torch.compile leaves it out of its graphs (`torch.compiler.disable`: dynamo
    does not trace saved-tensor hooks): it runs eagerly, hooks and all, between the compiled
    pieces (docs/sac.md, "Offload")."""
    forward = type(module).forward.__get__(module)
    if not torch.is_grad_enabled() or not module.training:
        return forward(*args, **kwargs)
    args, kwargs = cache_off(module, args, kwargs)
    existing = [*module.parameters(), *module.buffers(), *leaf_tensors((args, kwargs))]
    saved = SavedOnHost(existing, module.remat_sac_offload)
    with saved.hooks():
        out = forward(*args, **kwargs)
    saved.forward_done(out)
    return out
