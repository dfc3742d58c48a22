"""What outputs the loss does not use cost a step, before and after capture knows them.

    python -m benchmarks.running.zero_tangents [--models gpt2_4 bert_4 vit_4 llama_4] [--rounds 20]
                                       [--out results/zero_tangents]

Each zoo transformer is called the way HuggingFace users call it, ``out = model(**batch)``,
which returns the loss and the logits, and trained with ``out.loss.backward()``: autograd hands
the logits a zero gradient. The model is captured twice: as before (``backward_from=None``:
every output may get a gradient, so the executor materialises the logits' zero gradient and the
graph adds it to the loss's) and with ``backward_from=["loss"]`` (the zero tangent is known at
capture and the graph specialised, `graph_capture.trace.zero_tangents`). For each: the no-recompute
schedule (100%) is run; measured are its step peak (profiler allocation events above the
start of the step, ``.grad`` allocated before it) against the prediction, the bytes the
executor holds for tangents, and step times in interleaved rounds (medians); remat's loss,
every gradient and the parameters after 3 AdamW steps are compared with eager's
(``torch.equal``). Writes ``zero_tangents.{md,csv}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import torch

import solver
from benchmarks.common import Row, write_table
from benchmarks.running.measure import interleaved_times, measure_peaks
from benchmarks.zoo import ZOO
from executor.traced.module import Rematerialized
from graph_capture import capture

MODELS = ("gpt2_4", "bert_4", "vit_4", "llama_4")
VARIANTS = {"before": None, "backward_from=loss": ["loss"]}


def _hf_call(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The zoo model's HuggingFace model (returning its whole output) and its keyword batch."""
    bench = ZOO[name]()
    wrapper = bench.model
    return wrapper.model, dict(zip(wrapper.keys, bench.inputs, strict=True))


def _exact(model: torch.nn.Module, remat: Rematerialized, batch: dict, steps: int = 3) -> bool:
    """Loss, every gradient and the parameters after `steps` AdamW steps equal eager's."""
    eager = copy.deepcopy(model)
    runs = [(eager, torch.optim.AdamW(eager.parameters(), lr=1e-3))]
    runs.append((remat, torch.optim.AdamW(remat.parameters(), lr=1e-3)))
    same = True
    for step in range(steps):
        seen = []
        for module, optimizer in runs:
            torch.manual_seed(step)
            loss = module(**batch).loss
            loss.backward()
            seen.append([loss.detach(), *(p.grad.clone() for p in module.parameters())])
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        same &= all(torch.equal(a, b) for a, b in zip(*seen, strict=True))
    params = zip(eager.parameters(), remat.parameters(), strict=True)
    return same and all(torch.equal(a, b) for a, b in params)


def run_model(name: str, rounds: int) -> list[Row]:
    """One row per variant (`VARIANTS`) on zoo model `name`."""
    torch.set_num_threads(1)
    model, batch = _hf_call(name)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    remats: dict[str, Rematerialized] = {}
    facts: dict[str, Row] = {}
    for variant, backward_from in VARIANTS.items():
        own = copy.deepcopy(model)
        captured = capture(own, (), example_kwargs=batch, backward_from=backward_from)
        schedule = solver.baseline(captured.dag, "checkpoint_all")
        remats[variant] = Rematerialized(own, captured, schedule)
        facts[variant] = {
            "dag_nodes": captured.dag.number_of_nodes(),
            "held_tangents_bytes": captured.dag.graph["held_bytes"]["tangents"],
            "predicted_MiB": schedule.peak / 2**20,
            "exact": _exact(
                copy.deepcopy(model),
                Rematerialized(copy.deepcopy(model), captured, schedule),
                batch,
            ),
        }

    def step_of(module: torch.nn.Module):
        return lambda: module(**batch).loss.backward()

    steps = {"eager": step_of(model), **{v: step_of(r) for v, r in remats.items()}}
    peaks = measure_peaks(steps)
    times = interleaved_times(steps, rounds)
    before = peaks["before"]
    rows: list[Row] = []
    for key in steps:
        row: Row = {"model": name, "variant": key, "peak_MiB": peaks[key] / 2**20}
        row["step_ms"] = statistics.median(times[key]) * 1e3
        if key in facts:
            row.update(facts[key])
            row["measured_vs_predicted"] = peaks[key] / (facts[key]["predicted_MiB"] * 2**20)
            row["saved_bytes"] = before - peaks[key]
            row["saved_share_of_peak"] = (before - peaks[key]) / before
            row["time_vs_before"] = statistics.median(
                a / b for a, b in zip(times[key], times["before"], strict=True)
            )
        rows.append(row)
    print(f"{name}: saved {before - peaks['backward_from=loss']} bytes of {before}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=sorted(ZOO))
    parser.add_argument("--rounds", type=int, default=20, help="timing rounds (default 20)")
    parser.add_argument("--out", type=Path, default=Path("results/zero_tangents"))
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for name in args.models:
        rows += run_model(name, args.rounds)
        write_table(rows, args.out, "zero_tangents", "Zero tangents: before / known at capture")


if __name__ == "__main__":
    main()
