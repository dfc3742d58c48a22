"""Exceptions raised by the executor; each message says what differs and what to do.

Schedule problems reuse the solver's classes: `solver.errors.ScheduleMismatchError` (a schedule
solved for another graph) and `solver.errors.InvalidScheduleError` (the simulator rejects it).
"""

from solver.errors import RematError


class ExecutorError(RematError):
    """Base class of the executor's own errors."""


class RematerializeError(ExecutorError, ValueError):
    """`executor.rematerialize` cannot start as asked (a time limit that is not a positive
    number of seconds), or it, `Rematerialized.load` or `remat run` found the module's step on
    the example inputs differing from eager's (`check_against_eager`: the value named, no
    module returned); the message says what to do."""


class InputMismatchError(ExecutorError, ValueError):
    """The inputs differ (count, shape, dtype, device) from the example the graph was captured
    with, or their values would make an HF model's mask code take another branch than on the
    example (padding where the example had none, or the reverse); the captured graph is
    specialised to that example, so capture again for such inputs."""


class UnsupportedScheduleError(ExecutorError):
    """The schedule is valid for the solver but cannot run as a forward/backward pair, e.g. it
    computes a forward output only after backward work that needs the output's gradient."""


class AutocastMismatchError(ExecutorError):
    """A step runs under another autocast state (on/off, dtype) than the graph was captured
    under; the graph holds the casts of its capture, so capture under the step's autocast."""


class UnusedOutputGradientError(ExecutorError):
    """A step backpropagated a nonzero gradient into an output that the graph was captured as
    unused by the loss (``capture(..., backward_from=...)``): the graph assumes that gradient is
    zero, so capture again with ``backward_from`` naming the output."""


class BackwardError(ExecutorError, RuntimeError):
    """A backward the executor cannot run as asked: a second backward through one step of
    `Rematerialized` (retain_graph=True), or, under a SAC plan that offloads, a recompute
    outside the plan's recompute context or an offloaded op's output mutated after its copy."""


class PlanError(ExecutorError, ValueError):
    """`executor.checkpoint_plan` or `CheckpointPlan` cannot plan or load: inputs off the CPU,
    blocks that do not run once each per step, a recording that cannot finish within the time
    limit, a plan file that is not one (or of an older format); each message says what to
    change."""


class FitError(ExecutorError, ValueError):
    """`executor.fit` cannot answer: a factory that fails at a size (which, and why), a memory
    below what the parameters and optimizer state take alone, a graph that changes shape with
    the size, or a model whose forward does not return the loss."""


class OpStreamMismatchError(ExecutorError):
    """A checkpointed block dispatched another op than its SAC plan has at that position
    (changed code, another autocast or dtype): the plan's policy would save the wrong tensors,
    so the step is refused; solve the plan again for the model as it runs now."""


class CompileError(ExecutorError, ValueError):
    """`executor.compile` cannot hold the budget under torch.compile: a graph break (named),
    symbolic or data-dependent shapes, a budget below the least the compiled step reaches, or
    a plan that would recompute a random or mutating op; each message says what to change."""
