"""`LiftedConstant`: a tensor constant of the traced model, as a call in the joint graph."""

from __future__ import annotations

import torch

__all__ = ["LiftedConstant", "lifted_constants"]


class LiftedConstant:
    """Calling it returns ``value``, the tensor ``torch.export`` lifted under ``name``.

    The tensor is static memory (it lives as long as the graph, like a buffer): measurement
    gives the node no bytes of its own, and every compute returns the same tensor.
    """

    def __init__(self, name: str, value: torch.Tensor) -> None:
        self.name = name
        self.value = value
        self.__name__ = f"lifted_constant_{name}"

    def __call__(self) -> torch.Tensor:
        return self.value

    def __repr__(self) -> str:
        return f"lifted constant {self.name}"


def lifted_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The tensors of the graph's `LiftedConstant` nodes, in graph order."""
    return [n.target.value for n in gm.graph.nodes if isinstance(n.target, LiftedConstant)]
