"""Capture a PyTorch model's training step as a joint fx graph and a DAG for the solver."""

from graph_capture.torch_range import UnsupportedTorchError  # first: refuses an unsupported torch

# isort: split
from graph_capture.capture import capture
from graph_capture.captured import CapturedGraph, JointResult, eager_reference
from graph_capture.errors import CaptureError
from graph_capture.tensor_spec import TensorSpec

__all__ = [
    "CaptureError",
    "CapturedGraph",
    "JointResult",
    "TensorSpec",
    "UnsupportedTorchError",
    "capture",
    "eager_reference",
]
