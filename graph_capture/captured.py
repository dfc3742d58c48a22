"""`CapturedGraph`: the joint forward+backward fx graph, the solver's DAG, and the map between.

Layout of ``CapturedGraph.joint`` (an aten-level, functionalized ``torch.fx.GraphModule`` whose
``forward`` takes flat positional tensors and returns a flat ``list``):

Placeholders, in this order (names in the ``*_placeholders`` fields)::

    params   one per parameter, ``model.named_parameters()`` order (tied weights once,
             under their first name)                      -> param_names[i]
    buffers  one per buffer, ``model.named_buffers()`` order -> buffer_names[i]
    inputs   one per user input: the positional ``example_inputs``, then the keyword ones
             (``example_kwargs``) in ``kwarg_names`` order
    tangents one per forward output that requires grad, in output order; the incoming
             gradient of forward output ``tangent_output_indices[i]``

Outputs (the joint returns a flat list; the position of each item is in the index fields)::

    buffer updates  new values of the buffers the forward mutates (BatchNorm running stats,
                    num_batches_tracked), in buffer order      -> buffer_update_indices
    forward outputs the model's outputs, pytree-flattened      -> forward_output_indices
    grads           one slot per primal placeholder (params, buffers, inputs); ``None`` where
                    no gradient exists (buffers, inputs that do not require grad)
                    -> param_grad_indices, input_grad_indices

Nothing in the graph mutates its inputs: the executor copies buffer updates into the model
after the step (see `JointResult.apply_buffer_updates`). Random ops (``native_dropout``,
``rand*``, ``bernoulli``) are fx nodes drawing from their device's default generator, listed
in ``random_nodes``; an exact replay must restore the RNG state each one saw in the plain run.
Tensors the model builds from Python data (``torch.export``'s lifted constants) are
`graph_capture.trace.lifted.LiftedConstant` calls: static memory, in ``static_bytes["constants"]``.

The DAG (``networkx.DiGraph``; solver contract):

- node id: the name of the fx node producing the group's main value (its "anchor").
- ``mem`` (int, bytes): bytes of the storages this group creates that something outside the
  group reads (another group or the graph output), deduplicated by storage. Views and aliases
  add nothing. ``temp_mem`` (bytes): storages created and consumed inside the group.
- ``op_transient`` (int, bytes): measured, the most bytes computing the group holds at any
  moment beyond its inputs and its output (workspaces, temporaries, members' intermediates);
  ``transient``: that plus the graph attr ``held_bytes`` total (what the executor holds beside
  the schedule's values during a step, by part). Computing v needs the live bytes plus
  ``transient(v)`` (`graph_capture.measurement.transient`).
- ``cost``: seconds (least of repeated runs, ``cost_model="time"``; a parameter gradient's
  node includes adding it into ``.grad``) or FLOPs
  (``cost_model="flops"``) to compute the whole group once. ``time`` (s) and ``flops`` are
  always both present.
- ``phase`` in {"forward", "backward"}, ``backward`` (bool), ``name``, ``op`` (aten op of the
  anchor), ``module`` (nn.Module path, e.g. ``"blocks.0.attn"``; backward nodes carry the
  module of the forward op they differentiate), ``random`` (bool), ``shapes`` / ``dtypes``
  (of the anchor's tensor outputs), ``is_output`` (bool: a group member is a graph output).
- an edge u -> v for every data dependency of a member of v on a member of u.
- graph attr ``order``: all node ids, topological, every forward node before every backward
  node. Graph attrs ``static_bytes`` and ``granularity`` repeat the fields below;
  ``held_bytes`` as above.

Parameters, buffers, inputs and tangents are not DAG nodes: their bytes are in
``static_bytes``. Gradient outputs *are* produced by DAG nodes (their bytes are in those
nodes' ``mem``); ``static_bytes["grads"]`` reports their total for reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
import torch
from torch import nn

from graph_capture.errors import CaptureError
from graph_capture.measurement.device import AutocastState, no_autocast
from graph_capture.tensor_spec import TensorSpec
from graph_capture.trace.hf_masks import MaskGuard
from graph_capture.trace.zero_tangents import default_tangents, missing_gradient


@dataclass
class JointResult:
    """What one plain run of the joint graph produced.

    ``outputs``: forward outputs (flat, in the model's pytree order); ``param_grads``: parameter
    name -> gradient, for parameters that require grad (frozen ones have no entry);
    ``input_grads``: flat input index -> gradient for inputs that require grad;
    ``buffer_updates``: buffer name -> its new value.
    """

    outputs: list[torch.Tensor]
    param_grads: dict[str, torch.Tensor | None]
    input_grads: dict[int, torch.Tensor | None]
    buffer_updates: dict[str, torch.Tensor]

    def apply_buffer_updates(self, model: nn.Module) -> None:
        """Copy the new buffer values into ``model`` (what eager training does in place)."""
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for name, value in self.buffer_updates.items():
                buffers[name].copy_(value)


@dataclass
class CapturedGraph:
    """A model's joint forward+backward graph and the DAG the solver schedules.

    See the module docstring for the exact placeholder/output layout and DAG attributes.
    ``members[v]`` lists, in execution order, the fx node names DAG node ``v`` computes; every
    fx node other than placeholders and the output belongs to exactly one DAG node, and
    ``node_group`` is the inverse map (fx node name -> DAG node). ``output_treespec`` is the
    pytree spec that rebuilds the model's output structure from the flat forward outputs.
    ``cost_model`` ("time" or "flops") says what the DAG's ``cost`` holds. ``kwarg_names``:
    the keyword inputs, which follow the positional ones in ``input_specs`` and the
    placeholders. ``autocast``: the autocast state the graph was traced under (its casts are
    in the graph), for the model's device type. ``zero_tangent_outputs``: forward output
    positions whose incoming gradient is known zero (capture's ``backward_from``; the graph is
    specialised for it, `graph_capture.trace.zero_tangents`). ``mask_guards``: the decisions
    an HF model's mask code took from the example inputs' values, which the graph holds and
    each step must take alike (`graph_capture.trace.hf_masks.MaskGuard`).
    """

    joint: torch.fx.GraphModule
    dag: nx.DiGraph
    members: dict[str, list[str]]
    granularity: str
    cost_model: str
    param_names: list[str]
    param_placeholders: list[str]
    buffer_names: list[str]
    buffer_placeholders: list[str]
    input_placeholders: list[str]
    tangent_placeholders: list[str]
    tangent_output_indices: list[int]
    forward_output_indices: list[int]
    buffer_update_indices: dict[str, int]
    param_grad_indices: dict[str, int]
    input_grad_indices: dict[int, int]
    random_nodes: list[str]
    static_bytes: dict[str, int]
    input_specs: list[TensorSpec]
    output_specs: list[TensorSpec]
    kwarg_names: tuple[str, ...]
    autocast: AutocastState
    output_treespec: object = field(repr=False)
    node_group: dict[str, str] = field(default_factory=dict, repr=False)
    zero_tangent_outputs: tuple[int, ...] = ()
    mask_guards: tuple[MaskGuard, ...] = field(default=(), repr=False)

    @property
    def order(self) -> list[str]:
        """The DAG's topological order (forward nodes first)."""
        return self.dag.graph["order"]

    @property
    def first_backward_index(self) -> int:
        """Index in ``order`` of the first backward node (``len(order)`` if none)."""
        for i, v in enumerate(self.order):
            if self.dag.nodes[v]["backward"]:
                return i
        return len(self.order)

    def flat_inputs(
        self, inputs: Sequence[torch.Tensor], kwargs: Mapping[str, torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """The user inputs in placeholder order: ``inputs``, then ``kwargs`` in
        ``kwarg_names`` order. Raises `CaptureError` when the keyword names differ."""
        kwargs = kwargs or {}
        if set(kwargs) != set(self.kwarg_names):
            raise CaptureError(
                f"captured with keyword inputs {sorted(self.kwarg_names)}, got {sorted(kwargs)}"
            )
        return [*inputs, *(kwargs[name] for name in self.kwarg_names)]

    def placeholder_values(
        self,
        model: nn.Module,
        inputs: Sequence[torch.Tensor],
        tangents: Sequence[torch.Tensor],
    ) -> list[torch.Tensor]:
        """The joint's positional arguments: params, buffers, inputs, tangents (in layout order).
        ``inputs`` are all user inputs, keyword ones included (see `flat_inputs`).

        Raises `CaptureError` when ``inputs`` or ``tangents`` do not match the capture.
        """
        if len(inputs) != len(self.input_specs):
            raise CaptureError(
                f"expected {len(self.input_specs)} inputs {self.input_specs}, got {len(inputs)}"
            )
        for i, (tensor, spec) in enumerate(zip(inputs, self.input_specs, strict=True)):
            if (tuple(tensor.shape), tensor.dtype) != (spec.shape, spec.dtype):
                raise CaptureError(
                    f"input {i}: captured with shape {spec.shape} {spec.dtype}, got "
                    f"{tuple(tensor.shape)} {tensor.dtype}; capture again for new shapes"
                )
        if len(tangents) != len(self.tangent_placeholders):
            raise CaptureError(
                f"expected {len(self.tangent_placeholders)} tangents (one per output that "
                f"requires grad: outputs {self.tangent_output_indices}), got {len(tangents)}"
            )
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        return (
            [params[name] for name in self.param_names]
            + [buffers[name] for name in self.buffer_names]
            + list(inputs)
            + list(tangents)
        )

    def unpack_outputs(self, flat: Sequence[torch.Tensor | None]) -> JointResult:
        """Split the joint's flat output list into a `JointResult`."""
        return JointResult(
            outputs=[flat[i] for i in self.forward_output_indices],
            param_grads={n: flat[i] for n, i in self.param_grad_indices.items()},
            input_grads={k: flat[i] for k, i in self.input_grad_indices.items()},
            buffer_updates={n: flat[i] for n, i in self.buffer_update_indices.items()},
        )

    def run_plain(
        self,
        model: nn.Module,
        inputs: Sequence[torch.Tensor],
        tangents: Sequence[torch.Tensor],
        kwargs: Mapping[str, torch.Tensor] | None = None,
    ) -> JointResult:
        """Run every node of the joint graph once, in graph order (the reference run).

        Uses the global RNG from its current state, as eager forward+backward would; does not
        touch ``model`` (call ``apply_buffer_updates`` for BatchNorm statistics). Autocast is
        off while it runs: the graph holds the casts of the autocast state it was traced under.
        """
        args = self.placeholder_values(model, self.flat_inputs(inputs, kwargs), tangents)
        with torch.no_grad(), no_autocast(self.autocast.device_type):
            flat = self.joint(*args)
        return self.unpack_outputs(flat)

    def default_tangents(self) -> list[torch.Tensor]:
        """One tangent per differentiable forward output: ones (``sum()`` as the loss), and
        zeros for the known-zero ones (`graph_capture.trace.zero_tangents.missing_gradient`)."""
        return default_tangents(
            self.joint,
            self.tangent_placeholders,
            self.tangent_output_indices,
            self.output_specs,
            self.zero_tangent_outputs,
        )

    def missing_tangent(self, i: int) -> torch.Tensor:
        """Tangent ``i`` for a step in which its output got no gradient: zeros, held in one
        element when the graph no longer reads it (a known-zero tangent whose adds were
        folded)."""
        spec = self.output_specs[self.tangent_output_indices[i]]
        return missing_gradient(self.joint, self.tangent_placeholders[i], spec)


def eager_reference(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    tangents: Sequence[torch.Tensor],
    tangent_output_indices: Sequence[int],
    kwargs: Mapping[str, torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], Mapping[str, torch.Tensor | None], list[torch.Tensor | None]]:
    """Eager forward + backward: (flat outputs, param name -> grad, input grads), the model
    called as ``model(*inputs, **kwargs)`` (input grads of the positional inputs).

    Mutates ``model`` exactly as a training step's forward/backward would (BatchNorm running
    statistics, ``.grad`` fields are set from scratch).
    """
    for p in model.parameters():
        p.grad = None
    leaves = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
    out = model(*leaves, **(kwargs or {}))
    flat, _ = torch.utils._pytree.tree_flatten(out)
    diff = [flat[i] for i in tangent_output_indices]
    torch.autograd.backward(diff, list(tangents))
    grads = {name: p.grad for name, p in model.named_parameters()}
    return [t.detach() for t in flat], grads, [x.grad for x in leaves]
