"""`remat calibrate`: this device's measured op table, for estimate mode's ``--target FILE``.

Captures each model (``--model MODULE:FACTORY``, repeatable; or ``--demo``) on the device at
hand in the measured mode, and writes a device file (`solver.target.Device.save`) holding the
device's rates (this processor's, `graph_capture.measurement.roofline.cpu_device`) and, per op
key (`graph_capture.measurement.roofline.target_key`: the op and its inputs' shapes and dtypes),
the least measured seconds of that op among the captured graphs, and the most scratch bytes
(workspace) measured for it (``op_transient``), and the host link that CPU offloads copy over
(`graph_capture.measurement.link`: this machine's copy into a host pool, per direction the
latency in seconds and the bandwidth in bytes/s fitted to copies from 1 KiB to
``--link-bytes``). An estimate for that file then takes each op's seconds and workspace from the
tables where they have the op, the models elsewhere (the roofline with this processor's fixed
seconds per op; `graph_capture.measurement.workspace`); ``--offload FILE`` solves with its link.

``--base TARGET`` (a built-in GPU, run on a machine with CUDA) writes that target's published
figures with the host link measured over this machine's CUDA link in place of the published
one (pinned host memory, a side stream, CUDA events); op tables are not measured then (they
are measured on this processor, and would not be the GPU's).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from cli.profile import capture_with_args
from graph_capture.captured import CapturedGraph
from graph_capture.measurement.link import LINK_BYTES, MIN_LINK_BYTES, measure_host_link
from graph_capture.measurement.measure import SCRATCH_KEY, SECONDS_KEY
from graph_capture.measurement.roofline import cpu_device, target_key
from graph_capture.models.demos import MODELS, demo_model
from graph_capture.models.factories import import_factory, unpack_model
from solver.core.link import Link
from solver.errors import ArgumentError
from solver.target.devices import BUILT_IN, Device, builtin_device

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
    parser.add_argument(
        "--base",
        metavar="TARGET",
        choices=sorted(BUILT_IN),
        help="a built-in GPU whose published figures the file keeps, with the host link measured "
        "over this machine's CUDA link (needs CUDA; no --model/--demo)",
    )
    parser.add_argument(
        "--link-bytes",
        type=int,
        default=LINK_BYTES,
        metavar="BYTES",
        help=f"bytes of the largest timed host-link copy (default {LINK_BYTES}); the others "
        f"are a quarter of the one above, down to {MIN_LINK_BYTES}",
    )
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
    if args.base is not None:
        if args.model or args.demo:
            raise ArgumentError(
                "--base measures the GPU's host link only: op tables are measured on this "
                "processor; drop --model/--demo, or --base for a CPU device file"
            )
        if not torch.cuda.is_available():
            raise ArgumentError(
                f"--base {args.base} measures the host link over CUDA, and this machine has no "
                "CUDA device: run it on the GPU machine"
            )
        published = builtin_device(args.base)
        device = dataclasses.replace(
            published, host_link=measure_host_link("cuda", args.link_bytes)
        )
        device.save(args.out)
        print(f"wrote {args.out}: {_link_line(device, published.host_link)}", file=sys.stderr)
        return 0
    if not args.model and not args.demo:
        raise ArgumentError("give at least one --model MODULE:FACTORY or --demo NAME to measure")
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
    device = dataclasses.replace(
        cpu_device(),
        op_seconds=table,
        op_transient=transients,
        host_link=measure_host_link("cpu", args.link_bytes),
    )
    device.save(args.out)
    print(
        f"wrote {args.out}: device {device.name!r}, {len(table)} measured op keys "
        f"({sum(1 for v in transients.values() if v)} with a workspace), "
        f"{args.threads} thread(s); {_link_line(device, None)}",
        file=sys.stderr,
    )
    return 0


def _link_line(device: Device, published: Link | None) -> str:
    """The measured host link in GB/s and microseconds per copy per direction, beside the
    published one where given."""
    link = device.host_link
    line = f"{device.name!r} host link measured d2h {link.d2h / 1e9:.1f} GB/s, "
    line += f"h2d {link.h2d / 1e9:.1f}"
    if published is not None:
        line += f" (published {published.d2h / 1e9:.0f} and {published.h2d / 1e9:.0f})"
    line += f"; latency d2h {link.d2h_latency * 1e6:.2f} us, h2d {link.h2d_latency * 1e6:.2f} us"
    if published is not None:
        line += f" (published {published.d2h_latency * 1e6:g} and {published.h2d_latency * 1e6:g})"
    return line
