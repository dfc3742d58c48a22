"""Every built-in demo by name: the one registry the `remat` command and the benchmarks read.

A demo is either an example graph that needs no capture (`solver.examples`) or a PyTorch model
that is captured first (`graph_capture.models.demo_models`, each factory returning ``(model,
example_inputs)``). `remat solve --demo NAME` takes either; `remat profile` and `remat run`
take the models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from graph_capture.errors import CaptureError
from graph_capture.models import demo_models
from graph_capture.models.demo_models import Factory
from solver.examples import residual_demo


@dataclass(frozen=True)
class Demo:
    """A named demo: `graph` builds its solver graph directly, or `model` builds the model and
    example inputs to capture (exactly one of the two is set)."""

    name: str
    summary: str
    graph: Callable[[], nx.DiGraph] | None = None
    model: Factory | None = None


DEMOS: dict[str, Demo] = {
    demo.name: demo
    for demo in (
        Demo("residual", "ResNet-shaped training graph (no capture)", graph=residual_demo),
        Demo("gpt", "GPT-style decoder, 3 blocks, width 48", model=demo_models.gpt),
        Demo("resnet", "small ResNet with BatchNorm, 4 blocks", model=demo_models.resnet),
        Demo("unet", "U-Net, 2 levels, 8 channels", model=demo_models.unet),
    )
}
"""Every demo by the name the CLI takes."""

MODELS = tuple(name for name, demo in DEMOS.items() if demo.model is not None)
"""The demos that are PyTorch models (for `remat profile` and `remat run`)."""


def demo_model(name: str) -> Factory:
    """The factory of the demo model `name`; CaptureError naming the choices otherwise."""
    demo = DEMOS.get(name)
    if demo is None or demo.model is None:
        raise CaptureError(f"unknown demo model {name!r}; choose from {', '.join(MODELS)}")
    return demo.model
