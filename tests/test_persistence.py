"""Every runtime saves and loads one way: ``obj.save(path)``, ``Type.load(path, model, ...)``,
the file holding the schedule(s) and the fingerprint of the graph each belongs to; a file of
another model or graph is refused in one line. A loaded `Rematerialized` and a loaded
`CompiledModel` (under aot_eager) train bit-identically to the ones saved."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import executor
import solver
from executor.errors import CompileError
from solver.core.schedule import make_schedule
from solver.errors import ScheduleMismatchError

pytestmark = pytest.mark.usefixtures("one_thread")


class Tiny(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.drop = nn.Dropout(0.2)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.drop(torch.tanh(self.up(x)))).square().mean()


def _grads(call, model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The loss and every gradient of one step through `call`, seeded; `.grad` left None."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    loss = call(x)
    loss.backward()
    out = [loss.detach(), *(p.grad.clone() for p in model.parameters())]
    model.zero_grad(set_to_none=True)
    return out


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(s, t) for s, t in zip(a, b, strict=True))


def test_rematerialized_saves_and_loads_bit_identically(tmp_path):
    torch.manual_seed(0)
    model, x = Tiny().train(), torch.randn(32, 64)
    rm = executor.rematerialize(model, (x,), "90%", time_limit=20)
    path = tmp_path / "rm.json"
    rm.save(path)
    loaded = executor.Rematerialized.load(path, model, (x,))
    assert loaded.schedule.ops == rm.schedule.ops
    assert _equal(_grads(loaded, model, x), _grads(rm, model, x))
    other = Tiny(d=8).train()
    with pytest.raises(ScheduleMismatchError, match="solved for graph") as e:
        executor.Rematerialized.load(path, other, (torch.randn(8, 8),))
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def compiled(one_thread):
    torch.manual_seed(0)
    model, x = Tiny().train(), torch.randn(32, 64)
    return model, x, executor.compile(model, (x,), "min", backend="aot_eager")


def test_compiled_model_saves_and_loads_bit_identically(compiled, tmp_path):
    model, x, cm = compiled
    path = tmp_path / "cm.json"
    cm.save(path)
    saved = json.loads(path.read_text())
    fingerprints = [r["graph_fingerprint"] for r in saved["regions"]]
    assert fingerprints == [r.schedule.graph_fingerprint for r in cm.remat.regions]
    loaded = executor.CompiledModel.load(path, model, (x,))  # positional, as Rematerialized.load
    assert [r.schedule.ops for r in loaded.remat.regions] == [
        r.schedule.ops for r in cm.remat.regions
    ]
    assert loaded.remat.compiles == 1 and loaded.remat.budget == cm.remat.budget
    assert _equal(_grads(loaded, model, x), _grads(cm, model, x))


def test_a_compiled_file_of_another_model_or_graph_is_refused(compiled, tmp_path):
    model, _, cm = compiled
    path = tmp_path / "cm.json"
    cm.save(path)
    with pytest.raises(CompileError, match="saved for another model") as e:
        executor.CompiledModel.load(path, Tiny(d=8).train(), example_inputs=(torch.randn(8, 8),))
    assert "\n" not in str(e.value)
    with pytest.raises(CompileError, match="no saved schedule for this compiled region") as e:
        executor.CompiledModel.load(path, model, example_inputs=(torch.randn(16, 64),))
    assert "\n" not in str(e.value)


def test_a_compiled_file_whose_schedule_offloads_is_refused_on_a_cpu(compiled, tmp_path):
    """torch's offload ops need an accelerator: the load refuses in one line, as
    executor.compile(offload=) does on a CPU."""
    model, x, cm = compiled
    region = cm.remat.regions[0]
    problem = solver.prepare(region.dag)
    index = {v: i for i, v in enumerate(problem.ids)}
    ops = [(kind, index[v]) for kind, v in region.schedule.ops]
    first = next(i for i, (kind, _) in enumerate(ops) if kind == "compute")
    ops.insert(first + 1, ("offload", ops[first][1]))  # a copy never reloaded
    offloading = make_schedule(
        region.dag, problem, ops, method="by hand", link=solver.Link(1e15, 1e15)
    )
    path = tmp_path / "cm.json"
    cm.save(path)
    saved = json.loads(path.read_text())
    saved["regions"] = [json.loads(offloading.to_json())]
    path.write_text(json.dumps(saved))
    with pytest.raises(CompileError, match=r"offloads: torch's offload ops .* pinned host") as e:
        executor.CompiledModel.load(path, model, example_inputs=(x,))
    assert "\n" not in str(e.value)
