"""`remat calibrate`: this device's measured op table, for estimate mode's ``--target FILE``.

Captures each model (``--model MODULE:FACTORY``, repeatable; or ``--demo``) on the device at
hand in the measured mode, and writes a device file (`solver.target.Device.save`) holding the
device's rates (this processor's, `graph_capture.measurement.roofline.cpu_device`) and, per op
key (`graph_capture.measurement.roofline.target_key`: the op and its inputs' shapes and dtypes),
the least measured seconds of that op among the captured graphs. An estimate for that file
then takes each op's seconds from the table where it is there, the roofline elsewhere.
"""

from __future__ import annotations

import argparse
import sys

import torch

from cli.profile import capture_with_args
from graph_capture.captured import CapturedGraph
from graph_capture.measurement.measure import SECONDS_KEY
from graph_capture.measurement.roofline import cpu_device, target_key
from graph_capture.models.demos import MODELS, demo_model
from graph_capture.models.factories import import_factory, unpack_model
from solver.target import Device

__all__ = ["add_calibrate_arguments", "op_table", "run_calibrate"]


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


def op_table(captured: CapturedGraph) -> dict[str, float]:
    """Op key -> the least measured seconds of that op in ``captured`` (a measured capture)."""
    table: dict[str, float] = {}
    for node in captured.joint.graph.nodes:
        seconds = node.meta.get(SECONDS_KEY)
        if node.op != "call_function" or not seconds:
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        key = target_key(node.target, args, kwargs)
        table[key] = min(seconds, table.get(key, seconds))
    return table


def run_calibrate(args: argparse.Namespace) -> int:
    """Measure, write the device file; exit status 0."""
    if not args.model and not args.demo:
        raise ValueError("give at least one --model MODULE:FACTORY or --demo NAME to measure")
    torch.set_num_threads(args.threads)
    factories = [import_factory(m) for m in args.model] + [demo_model(d) for d in args.demo]
    table: dict[str, float] = {}
    for factory in factories:
        captured = capture_with_args(args, *unpack_model(factory()))
        for key, seconds in op_table(captured).items():
            table[key] = min(seconds, table.get(key, seconds))
    rates = cpu_device()
    device = Device(
        rates.name, rates.flops, rates.bandwidth, rates.memory, rates.rounding, op_seconds=table
    )
    device.save(args.out)
    print(
        f"wrote {args.out}: device {device.name!r}, {len(table)} measured op keys, "
        f"{args.threads} thread(s)",
        file=sys.stderr,
    )
    return 0
