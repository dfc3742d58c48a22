"""The whole-activation offload baselines of `benchmarks.running.offload_compare` as training
steps, beside the plain step (`loss_step`) and the gradients of a step (`step_gradients`):

- ``save_on_cpu`` (`SaveOnCpu`): `torch.autograd.graph.save_on_cpu`'s semantics (its source,
  torch 2.13): every tensor autograd saves is copied to a new contiguous host tensor of its size
  when saved (parameters' views too) and copied back to a new device tensor when the backward
  reads it; both copies on the compute stream, so on a GPU each copy's link time adds to the
  step.
- ``HF offload`` (`hf_step`): HF transformers' ``activation_checkpointing_enable(offload=True)``
  (transformers 5.x ``modeling_utils``): each block under non-reentrant
  `torch.utils.checkpoint`, the call inside ``save_on_cpu``, so what reaches the hooks is what
  checkpoint saves (the block's inputs); the blocks' forwards rerun in the backward.
- ``torchtune`` (`TorchtuneOffload`): torchtune's ``OffloadActivations`` semantics as its
  documentation and source state them (torchtune is not installed; written here): a saved
  tensor of at least 1 KiB (``min_offload_size``, its elements' bytes) that is not an
  ``nn.Parameter`` or ``nn.Buffer`` is copied to a host tensor of its layout (``empty_like``)
  when saved, the device source held until five later saves (``max_fwd_stash_size``: on a GPU
  the copy runs on a side stream, and the compute stream waits for it there); the backward reads
  a tensor still so held from the device, else copies it back when its node reads it, the copy
  held until the next node has run; smaller tensors and parameters stay on the device. Left
  out: its views trick (a reloaded tensor's storage kept past its node where views of it
  outlive the unpack).

The host copies live in an `executor.traced.offload.HostPool`, as remat's own executor's do.
torch's own ``save_on_cpu`` cannot be measured apart on this machine: its host tensors come
from the same c10 CPU allocator as the "device" tensors (and a CPU tensor's ``.cpu()`` is
itself, no copy), so host and device are one memory; hence the hooks here, which copy as
torch's do into the pool.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.traced.offload import HostPool
from graph_capture.measurement.device import fork_rng

Step = Callable[[], None]


def _host_tensor(pool: HostPool, like: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """A host tensor of `like`'s dtype and size with `stride`, on `pool`'s memory (the bytes of
    its elements; released when the tensor is collected)."""
    nbytes = like.numel() * like.element_size()
    buffer = pool.allocate(nbytes)
    host = torch.empty(0, dtype=like.dtype).set_(buffer.untyped_storage(), 0, like.size(), stride)
    weakref.finalize(host, pool.release, buffer)
    return host


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A new device tensor with `host`'s values and layout (as ``.to(device)`` makes one)."""
    out = torch.empty_strided(host.size(), host.stride(), dtype=host.dtype, device=device)
    return out.copy_(host)


@dataclass
class SaveOnCpu:
    """`torch.autograd.graph.save_on_cpu(pin_memory=True)`'s pack and unpack, the host tensors
    in `pool`: every saved tensor to a new contiguous host tensor, back to a new device tensor
    at each read. `d2h_bytes`, `h2d_bytes`: bytes copied each way since made; `d2h_copies`,
    `h2d_copies`: the copies."""

    pool: HostPool
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    d2h_copies: int = 0
    h2d_copies: int = 0

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        host = _host_tensor(self.pool, tensor, torch.empty(tensor.size(), device="meta").stride())
        host.copy_(tensor)
        self.d2h_bytes += tensor.numel() * tensor.element_size()
        self.d2h_copies += 1
        return tensor.device, host

    def unpack(self, packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        device, host = packed
        self.h2d_bytes += host.numel() * host.element_size()
        self.h2d_copies += 1
        return _to_device(host, device)


@dataclass
class TorchtuneOffload:
    """torchtune's ``OffloadActivations`` (``use_streams=True``) pack and unpack for one step,
    the host tensors in `pool` (the module docstring states what it does). `d2h_bytes`,
    `h2d_bytes`: bytes copied each way since made; `d2h_copies`, `h2d_copies`: the copies."""

    pool: HostPool
    min_offload_bytes: int = 1024
    max_fwd_stash: int = 5
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    d2h_copies: int = 0
    h2d_copies: int = 0
    tracker: dict[int, tuple[torch.Tensor, bool]] = field(default_factory=dict)
    fwd_stash: dict[int, torch.Tensor] = field(default_factory=dict)
    bwd_stash: dict[int, torch.Tensor] = field(default_factory=dict)
    node: object = None
    next_id: int = 0

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, activation: torch.Tensor) -> int:
        tensor_id, self.next_id = self.next_id, self.next_id + 1
        nbytes = activation.numel() * activation.element_size()
        if nbytes < self.min_offload_bytes or isinstance(activation, nn.Parameter | nn.Buffer):
            self.tracker[tensor_id] = (activation, False)
            return tensor_id
        for old in [k for k in self.fwd_stash if k <= tensor_id - self.max_fwd_stash]:
            del self.fwd_stash[old]  # on a GPU: the compute stream waits for its copy here
        stride = torch.empty_like(activation, device="meta").stride()
        host = _host_tensor(self.pool, activation, stride)
        host.copy_(activation)
        self.d2h_bytes += nbytes
        self.d2h_copies += 1
        self.tracker[tensor_id] = (host, True)
        self.fwd_stash[tensor_id] = activation
        return tensor_id

    def unpack(self, tensor_id: int) -> torch.Tensor:
        tensor, offloaded = self.tracker.pop(tensor_id)
        if not offloaded:
            return tensor
        node = torch._C._current_autograd_node()
        previous = [] if node is self.node else list(self.bwd_stash)
        self.node = node
        if tensor_id in self.fwd_stash:
            tensor = self.fwd_stash[tensor_id]
        else:
            tensor = _to_device(tensor, tensor.device)
            self.h2d_bytes += tensor.numel() * tensor.element_size()
            self.h2d_copies += 1
            self.bwd_stash[tensor_id] = tensor

        def after_node(outputs: object, inputs: object) -> None:
            self.fwd_stash.clear()
            for k in previous:
                self.bwd_stash.pop(k, None)

        node.register_hook(after_node)
        return tensor

    def finish(self) -> None:
        """The step's end: nothing held (torchtune's next forward starts from empty stashes)."""
        self.fwd_stash.clear()
        self.bwd_stash.clear()
        self.node = None


def loss_step(model: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]) -> Step:
    """A step of `model` on `inputs`: its forward, then the backward from the loss it returns."""

    def run() -> None:
        model(*inputs).backward()

    return run


def hooked_step(
    model: nn.Module, inputs: Sequence[torch.Tensor], make: Callable[[], object]
) -> tuple[Step, list]:
    """A step under fresh hooks from `make()` each time; the last step's hooks in the list."""
    last: list = [None]

    def run() -> None:
        hooks = make()
        last[0] = hooks
        with hooks.hooks():
            loss = model(*inputs)
        loss.backward()
        if isinstance(hooks, TorchtuneOffload):
            hooks.finish()

    return run, last


def hf_step(
    model: nn.Module, inputs: Sequence[torch.Tensor], blocks: Sequence[nn.Module], pool: HostPool
) -> tuple[Step, list]:
    """HF's offload: each block checkpointed (non-reentrant) inside ``save_on_cpu``."""
    last: list = [None]

    def wrap(block: nn.Module) -> None:
        forward = block.forward

        def offloaded(*args: object, **kwargs: object) -> object:
            with last[0].hooks():
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        block.forward = offloaded

    for block in blocks:
        wrap(block)

    def run() -> None:
        last[0] = SaveOnCpu(pool)
        model(*inputs).backward()

    return run, last


def step_gradients(model: nn.Module, step: Step, seed: int) -> list[torch.Tensor]:
    """`model`'s parameters' gradients after one `step` from zeroed gradients, the CPU seeded
    with `seed` (the global RNG state restored after)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with fork_rng(torch.device("cpu")):
        torch.manual_seed(seed)
        step()
    return [p.grad.clone() for p in model.parameters()]
