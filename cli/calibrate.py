"""`remat calibrate`: this device's measured op table, for estimate mode's ``--target FILE``.

Captures each model (``--model MODULE:FACTORY``, repeatable; or ``--demo``) on the device at
hand in the measured mode, and writes a device file (`solver.target.Device.save`) holding the
device's rates (this processor's, `graph_capture.measurement.roofline.cpu_device`) and, per op
key (`graph_capture.measurement.roofline.target_key`: the op and its inputs' shapes and dtypes),
the least measured seconds of that op among the captured graphs, and the most scratch bytes
(workspace) measured for it (``op_transient``). An estimate for that file then takes each op's
seconds and workspace from the tables where they have the op, the models elsewhere (the
roofline with this processor's fixed seconds per op; `graph_capture.measurement.workspace`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from cli.profile import capture_with_args
from graph_capture.captured import CapturedGraph
from graph_capture.measurement.measure import SCRATCH_KEY, SECONDS_KEY
from graph_capture.measurement.roofline import cpu_device, target_key
from graph_capture.models.demos import MODELS, demo_model
from graph_capture.models.factories import import_factory, unpack_model

__all__ = ["add_calibrate_arguments", "op_table", "run_calibrate", "transient_table"]


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        action="append",
        default=[],
        help="a model factory to measure (repeatable), as for remat solve",
    )
    parser.add_argument("--demo", action="append", default=[], choices=MODELS)
    parser.add_argument("--out", required=True, metavar="FILE.json", help="the device file")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.set_defaults(
        granularity="op", cost_model="time", module_depth=None, backward_from=None, target=None
    )


def _measured(captured: CapturedGraph, meta_key: str) -> list[tuple[str, float]]:
    """(op key, value) of every op of ``captured`` (a measured capture) carrying ``meta_key``."""
    found = []
    for node in captured.joint.graph.nodes:
        value = node.meta.get(meta_key)
        if node.op != "call_function" or value is None:
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        found.append((target_key(node.target, args, kwargs), value))
    return found


def op_table(captured: CapturedGraph) -> dict[str, float]:
    """Op key -> the least measured seconds of that op in ``captured`` (a measured capture)."""
    table: dict[str, float] = {}
    for key, seconds in _measured(captured, SECONDS_KEY):
        if seconds:
            table[key] = min(seconds, table.get(key, seconds))
    return table


def transient_table(captured: CapturedGraph) -> dict[str, int]:
    """Op key -> the most scratch bytes measured for that op in ``captured`` (a measured
    capture): its workspace, counted whole wherever the key recurs."""
    table: dict[str, int] = {}
    for key, scratch in _measured(captured, SCRATCH_KEY):
        table[key] = max(int(scratch), table.get(key, 0))
    return table


def run_calibrate(args: argparse.Namespace) -> int:
    """Measure, write the device file; exit status 0."""
    if not args.model and not args.demo:
        raise ValueError("give at least one --model MODULE:FACTORY or --demo NAME to measure")
    torch.set_num_threads(args.threads)
    factories = [import_factory(m) for m in args.model] + [demo_model(d) for d in args.demo]
    table: dict[str, float] = {}
    transients: dict[str, int] = {}
    for factory in factories:
        captured = capture_with_args(args, *unpack_model(factory()))
        for key, seconds in op_table(captured).items():
            table[key] = min(seconds, table.get(key, seconds))
        for key, scratch in transient_table(captured).items():
            transients[key] = max(scratch, transients.get(key, 0))
    device = dataclasses.replace(cpu_device(), op_seconds=table, op_transient=transients)
    device.save(args.out)
    print(
        f"wrote {args.out}: device {device.name!r}, {len(table)} measured op keys "
        f"({sum(1 for v in transients.values() if v)} with a workspace), "
        f"{args.threads} thread(s)",
        file=sys.stderr,
    )
    return 0
