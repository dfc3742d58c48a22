"""The largest batch of the published Checkmate graphs on Checkmate's device, proven.

Checkmate's protocol (MLSys 2020, §6.4 and Fig. 6; its max-batch ILP in the Checkmate
repository, `experiments/solver_ilp_max_batchsize.py` and `experiment_max_batchsize_ilp.py`):

- memory: a V100's 16 GB (16e9 bytes) less the fixed bytes `cost_ram_fixed` = parameters and
  their gradients (2 x 4 bytes per parameter);
- activation bytes linear in the batch: every node's bytes at batch b are the file's bytes
  times b / the file's batch (every node's bytes divide exactly; checked);
- compute capped at one extra forward pass: the cost of every node once plus the cost of the
  forward nodes once more (`cpu_fwd_factor=2`: 2 x forward + backward).

Where this differs: costs are the file's `cost_cpu` (profiled at the file's batch) and are not
scaled (the cap is a multiple of them, so the schedules within it are the same at every batch);
the batch is an integer (Checkmate's ILP makes it a continuous variable); the files carry no
parameter bytes, so the Keras applications' parameter counts are used (Keras's published
figures: VGG16 138,357,544; VGG19 143,667,240; MobileNet 4,253,864; ResNet50 25,636,712) and
the segmentation graphs get the whole 16e9 bytes, with the fixed bytes up to which the answer
stands ("holds while fixed <="). The proof is over Checkmate's stage schedules, the space its
ILP searched (`solver.fitting.search`, NOTE [fit proofs] in `solver.fitting.probe`).

Run: nice -n 5 python -m benchmarks.planning.fit_published [--time-limit 600] [--graphs VGG16 ...]
     [--out results]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from benchmarks.common import GRAPHS_DIR, Row, write_table
from solver.fitting.search import largest_fitting
from solver.io import load_graph

DEVICE_BYTES = 16 * 1000**3
"""A V100's memory as Checkmate counts it (`platform_memory("p32xlarge")`)."""


@dataclass(frozen=True)
class Published:
    """One published graph: its file stem, the batch its bytes were extracted at, the Keras
    model's parameter count (None: not known here), and Checkmate's reported batch."""

    stem: str
    batch: int
    parameters: int | None
    checkmate: int | None


GRAPHS = {
    "VGG16": Published("VGG16_256_224x224x3", 256, 138_357_544, None),
    "VGG19": Published("VGG19_256_224x224x3", 256, 143_667_240, 289),
    "MobileNet": Published("MobileNet_512_224x224x3", 512, 4_253_864, 1105),
    "ResNet50": Published("ResNet50_256_224x224x3", 256, 25_636_712, None),
    "VGG-UNet": Published("vgg_unet_32_416x608x3", 32, None, 61),
    "SegNet": Published("segnet_32_416x608x3", 32, None, None),
    "FCN8": Published("fcn_8_vgg_32_416x608x3", 32, None, None),
}


def per_sample(graph: nx.DiGraph, batch: int) -> nx.DiGraph:
    """The graph at batch 1: every node's bytes divided by the file's batch (ValueError where a
    node's bytes do not divide: they would not be linear in the batch)."""
    one = graph.copy()
    for v, attrs in one.nodes(data=True):
        if attrs["mem"] % batch:
            raise ValueError(f"node {v!r}: {attrs['mem']} B is not a multiple of batch {batch}")
        attrs["mem"] //= batch
    return one


def at_batch(one: nx.DiGraph, batch: int) -> nx.DiGraph:
    """The graph at `batch`: bytes times the batch, costs as they are."""
    graph = one.copy()
    for _, attrs in graph.nodes(data=True):
        attrs["mem"] *= batch
    return graph


def fit_row(label: str, time_limit: float) -> Row:
    """Fit one published graph under Checkmate's protocol; one table row."""
    spec = GRAPHS[label]
    one = per_sample(load_graph(GRAPHS_DIR / f"{spec.stem}_train_nx.json"), spec.batch)
    total = sum(a["cost"] for _, a in one.nodes(data=True))
    forward = sum(a["cost"] for _, a in one.nodes(data=True) if not a.get("backward"))
    fixed = 0 if spec.parameters is None else 2 * 4 * spec.parameters
    memory = DEVICE_BYTES - fixed
    started = time.perf_counter()
    fit = largest_fitting(
        lambda b: at_batch(one, b),
        memory,
        compute_budget=f"{total + forward}units",
        time_limit=time_limit,
        progress=lambda p: print(f"  {label} batch {p.size}: {p.verdict} ({p.reason})", flush=True),
    )
    seconds = time.perf_counter() - started
    peak = None if fit.schedule is None else fit.schedule.peak
    return {
        "graph": label,
        "nodes": one.number_of_nodes(),
        "fixed bytes": fixed if spec.parameters is not None else "0 (not known)",
        "memory bytes": memory,
        "cap (x once)": round((total + forward) / total, 4),
        "max batch": fit.size,
        "proven": "yes" if fit.proven else f"open: [{fit.size}, {fit.upper})",
        "peak at max (B)": peak,
        "holds while fixed <=": None if spec.parameters or peak is None else DEVICE_BYTES - peak,
        "Checkmate": spec.checkmate,
        "probes": len(fit.probes),
        "s": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per graph")
    parser.add_argument("--graphs", nargs="*", choices=list(GRAPHS), default=list(GRAPHS))
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    if not GRAPHS_DIR.is_dir():
        print(f"published graphs not found at {GRAPHS_DIR}: skipped")
        return
    rows = [fit_row(label, args.time_limit) for label in args.graphs]
    path = write_table(rows, args.out, "fit_published", "Largest batch, Checkmate's protocol")
    print(path.read_text())


if __name__ == "__main__":
    main()
