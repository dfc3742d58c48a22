"""Capture the zoo's joint forward+backward graphs into graph files and a manifest.

Each zoo model (`benchmarks.zoo.ZOO`) at its default size is captured with
`graph_capture.capture` (cost model "time": node costs in measured seconds; one thread) and its
DAG written as node-link JSON (`solver.io.save_graph`, readable by `remat solve FILE` and
`solver.io.load_graph`) to ``DIR/NAME.json`` (``DIR/NAME.module.json`` at module granularity).
``DIR/manifest.json`` lists, per graph: nodes, edges, the checkpoint-all peak (bytes), the total
cost (seconds of computing every node once), capture seconds, torch and transformers versions;
with ``--measure`` also eager's median step seconds and measured peak (bytes, `.grad`
preallocated as in docs/executor.md) and its ratio to the checkpoint-all peak. A model that
fails to build or capture gets its error in the manifest instead. Running a subset updates
those models' entries and keeps the others. The files are generated, never edited by hand.

Run: python -m benchmarks.running.capture_graphs [--out results/graphs] [--models NAME ...]
     [--granularity op|module] [--measure]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import solver
from benchmarks.zoo import ZOO, Bench
from executor.memory import measure_peak, median_seconds
from graph_capture import capture
from graph_capture.capture import GRANULARITIES
from solver.io import save_graph

Entry = dict[str, object]


def _versions() -> dict[str, str]:
    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = "not installed"
    return {"torch": torch.__version__, "transformers": hf}


def graph_file(name: str, granularity: str) -> str:
    """The graph file's name for zoo model `name` at `granularity`."""
    return f"{name}.json" if granularity == "op" else f"{name}.{granularity}.json"


def eager_measures(bench: Bench, repeats: int = 5) -> Entry:
    """Eager training step of `bench`: median seconds over `repeats` and measured peak bytes
    above the start, `.grad` preallocated (one step runs first), RNG and weights restored."""
    model, inputs = bench
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.random.fork_rng(devices=[]):
        model(*inputs).backward()
        peak = measure_peak(lambda: model(*inputs).backward()).peak_bytes
        seconds = median_seconds(lambda: model(*inputs).backward(), repeats=repeats, warmup=0)
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    return {"eager_step_seconds": seconds, "eager_peak_bytes": peak}


def capture_one(
    name: str, factory: Callable[[], Bench], out: Path, granularity: str, measure: bool
) -> Entry:
    """Build `factory`'s model and capture it, write its graph file for `name` into `out`;
    its manifest entry (with an ``error`` instead of the numbers when it fails)."""
    entry: Entry = {"name": name, "granularity": granularity, "cost_model": "time"}
    entry.update(_versions())
    try:
        bench = factory()
        started = time.perf_counter()
        captured = capture(*bench, granularity=granularity, cost_model="time")
        entry["capture_seconds"] = round(time.perf_counter() - started, 2)
    except Exception as error:  # reported, not raised: the manifest says which models fail
        entry["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:500]}"
        return entry
    dag = captured.dag
    dag.graph["name"] = name
    path = out / graph_file(name, granularity)
    save_graph(dag, path)
    full_peak = solver.checkpoint_all_peak(solver.prepare(dag))
    entry.update(
        file=path.name,
        nodes=dag.number_of_nodes(),
        edges=dag.number_of_edges(),
        forward_nodes=captured.first_backward_index,
        checkpoint_all_peak_bytes=full_peak,
        total_cost_seconds=sum(dag.nodes[v]["cost"] for v in dag),
        static_bytes=sum(captured.static_bytes.values()),
        random_nodes=sum(1 for v in dag if dag.nodes[v]["random"]),
    )
    if measure:
        entry.update(eager_measures(bench))
        entry["eager_over_checkpoint_all"] = round(entry["eager_peak_bytes"] / full_peak, 3)
    return entry


def _row(e: Entry) -> str:
    if "error" in e:
        return f"| {e['name']} | failed: {e['error']} |"
    cells = [
        e["name"],
        e["nodes"],
        f"{e['capture_seconds']:.1f}",
        f"{e['checkpoint_all_peak_bytes'] / 2**20:.2f}",
        f"{e['total_cost_seconds']:.3f}",
    ]
    if "eager_peak_bytes" in e:
        cells += [
            f"{e['eager_step_seconds']:.3f}",
            f"{e['eager_peak_bytes'] / 2**20:.2f}",
            f"{e['eager_over_checkpoint_all']:.2f}",
        ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def write_manifest(entries: list[Entry], out: Path) -> Path:
    """Merge `entries` into ``out/manifest.json`` (replacing entries of the same name and
    granularity), sorted by name; returns its path."""
    path = out / "manifest.json"
    kept = json.loads(path.read_text())["graphs"] if path.exists() else []
    fresh = {(e["name"], e["granularity"]) for e in entries}
    merged = [e for e in kept if (e["name"], e["granularity"]) not in fresh] + entries
    merged.sort(key=lambda e: (e["name"], e["granularity"]))
    path.write_text(json.dumps({"graphs": merged}, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/graphs"))
    parser.add_argument("--models", nargs="*", metavar="NAME", help="zoo names (default: all)")
    parser.add_argument("--granularity", choices=GRANULARITIES, default="op")
    parser.add_argument(
        "--measure", action="store_true", help="also measure eager step seconds and peak"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models or ()) - set(ZOO))
    if unknown:
        parser.error(f"unknown zoo models {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    header = "| model | nodes | capture s | checkpoint-all peak MiB | total cost s |"
    if args.measure:
        header += " eager step s | eager peak MiB | eager / checkpoint-all |"
    print(header)
    entries = []
    for name in args.models or ZOO:
        entries.append(capture_one(name, ZOO[name], args.out, args.granularity, args.measure))
        print(_row(entries[-1]), flush=True)
    print(f"wrote {write_manifest(entries, args.out)}", file=sys.stderr)
    return 1 if any("error" in e for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())
