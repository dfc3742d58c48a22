"""Graph and model sources for the `remat` CLI, and the `remat profile` subcommand.

A graph comes from a node-link JSON file, a built-in demo (`graph_capture.models.demos`: an example
graph, or a demo model that is captured), or ``--model pkg.module:factory``: ``factory`` is
imported (from the current directory too, as ``python -m`` would) and called with no arguments
and must return ``(model, example_inputs)`` or ``(model, example_inputs, example_kwargs)``
(keyword tensor arguments, e.g. ``labels=``). Models are traced with `graph_capture.capture`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

import networkx as nx
import torch
from torch import nn

from graph_capture.capture import GRANULARITIES, capture
from graph_capture.captured import CapturedGraph
from graph_capture.errors import CaptureError
from graph_capture.models.demos import DEMOS, MODELS, demo_model
from graph_capture.models.factories import import_factory, unpack_model
from graph_capture.profile import format_table, module_profile, plot_saved_bytes
from solver.core.budget import human_bytes
from solver.errors import RematError
from solver.io import load_graph, save_graph
from solver.target import TARGET_NAMES


def add_model_arguments(parser: argparse.ArgumentParser, *, demo: bool = True) -> None:
    """Add ``--model``, capture options and (unless the parser has one) ``--demo``."""
    if demo:
        parser.add_argument(
            "--demo",
            metavar="NAME",
            choices=MODELS,
            help=f"built-in model: {', '.join(MODELS)}",
        )
    parser.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        help="a callable returning (model, example_inputs[, example_kwargs]), e.g. "
        "mypkg.models:make; MODULE is imported from the current directory or the installed "
        "packages",
    )
    parser.add_argument(
        "--granularity",
        choices=GRANULARITIES,
        default="op",
        help="DAG nodes: one per allocating aten op, or runs of one module (default op)",
    )
    parser.add_argument(
        "--module-depth",
        type=int,
        default=None,
        metavar="D",
        help="with --granularity module: group by module path truncated to D components",
    )
    parser.add_argument(
        "--cost-model",
        choices=("time", "flops"),
        default="time",
        help="node cost: measured seconds (default) or FLOPs",
    )
    parser.add_argument(
        "--backward-from",
        nargs="+",
        metavar="OUTPUT",
        default=None,
        help="the outputs the training step backpropagates from, by top-level name (e.g. loss) "
        "or tuple index; the other outputs' zero gradients then cost nothing (default: every "
        "output that requires grad)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads while capturing (default: torch's own count; remat run: "
        "the count its --schedule was captured with, else 1). Op workspaces depend on it, so a "
        "schedule runs only on a capture with the same count",
    )


def add_graph_arguments(parser: argparse.ArgumentParser) -> None:
    """A graph file, or ``--demo`` (any demo) or ``--model`` and the capture options."""
    parser.add_argument(
        "graph",
        nargs="?",
        help="node-link JSON graph file (e.g. a Checkmate graph from ../shared/graphs)",
    )
    parser.add_argument(
        "--demo",
        nargs="?",
        const="residual",
        default=None,
        metavar="NAME",
        help="a built-in demo instead of a file (default residual): "
        + "; ".join(f"{d.name}: {d.summary}" for d in DEMOS.values()),
    )
    add_model_arguments(parser, demo=False)
    add_target_argument(parser)


def add_target_argument(parser: argparse.ArgumentParser) -> None:
    """``--target``: estimate mode (docs/estimate.md)."""
    parser.add_argument(
        "--target",
        metavar="NAME|FILE",
        default=None,
        help="estimate mode: plan for this device without running a real step (a built-in "
        f"name: {', '.join(TARGET_NAMES)}; or a device file written by remat calibrate); the "
        "model may be built on the meta device",
    )


def graph_from_args(args: argparse.Namespace) -> nx.DiGraph:
    """The solver DAG the arguments name: a file, a demo graph, or a captured model."""
    sources = [bool(args.graph), args.demo is not None, bool(args.model)]
    if sum(sources) > 1:
        raise RematError("give one graph source: a graph file, --demo or --model")
    if args.demo is not None and args.demo not in DEMOS:
        raise RematError(f"unknown demo {args.demo!r}; choose from {', '.join(DEMOS)}")
    demo = DEMOS.get(args.demo)
    built = bool(args.graph) or (demo is not None and demo.graph is not None)
    if built and getattr(args, "target", None) is not None:
        source = f"the graph file {args.graph}" if args.graph else f"the demo graph {args.demo}"
        raise RematError(
            f"--target estimates a capture for a device, and {source} is not captured: its "
            "costs are fixed; drop --target, or capture the model with it (--model M:F or a "
            "demo model)"
        )
    if args.graph:
        return load_graph(args.graph)
    if demo is not None and demo.graph is not None:
        return demo.graph()
    if demo is None and not args.model:
        raise RematError("give a graph file (remat solve GRAPH.json), --demo or --model")
    return capture_from_args(args).dag


def load_model_from_args(
    args: argparse.Namespace,
) -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """Build ``(model, example_inputs, example_kwargs)`` from ``--model`` or ``--demo``."""
    if getattr(args, "model", None):
        made = import_factory(args.model)()
    elif getattr(args, "demo", None):
        made = demo_model(args.demo)()
    else:
        raise CaptureError(f"give --model MODULE:FACTORY or --demo {{{', '.join(MODELS)}}}")
    return unpack_model(made)


def capture_from_args(args: argparse.Namespace) -> CapturedGraph:
    """Load the model named by the arguments and capture it; prints a one-line summary."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return capture_with_args(args, *load_model_from_args(args))


def output_names(args: argparse.Namespace) -> list[str | int] | None:
    """``--backward-from``'s output names, tuple indices as ints (None when not given)."""
    names = getattr(args, "backward_from", None)
    if names is None:
        return None
    return [int(n) if n.isdigit() else n for n in names]


def capture_with_args(
    args: argparse.Namespace,
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    kwargs: dict[str, torch.Tensor],
    summary: TextIO | None = None,
) -> CapturedGraph:
    """Capture `model` called with `inputs` and `kwargs`, with the capture options of the
    arguments (granularity, cost model, module depth) within the command's ``--time-limit``
    seconds where it has one; prints a one-line summary to `summary` (default stderr: stdout
    carries the command's tables)."""
    started = time.perf_counter()
    graph = capture(
        model,
        inputs,
        example_kwargs=kwargs,
        granularity=args.granularity,
        cost_model=args.cost_model,
        module_depth=args.module_depth,
        backward_from=output_names(args),
        plain_peak=getattr(args, "target", None) is None,
        target=getattr(args, "target", None),
        time_limit=getattr(args, "time_limit", None),
    )
    dag = graph.dag
    mode = f"estimated for target {dag.graph['target']!r} in" if "target" in dag.graph else "in"
    forward = graph.first_backward_index
    print(
        f"captured {type(model).__name__}: {len(graph.joint.graph.nodes)} fx nodes -> "
        f"{dag.number_of_nodes()} DAG nodes ({forward} forward, "
        f"{dag.number_of_nodes() - forward} backward) at {graph.granularity} granularity, "
        f"cost={graph.cost_model}, {dag.graph['threads']} thread(s), "
        f"{mode} {time.perf_counter() - started:.1f} s; static: "
        + ", ".join(f"{k} {human_bytes(v)}" for k, v in graph.static_bytes.items()),
        file=summary or sys.stderr,
    )
    return graph


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``remat profile``."""
    parser.add_argument("name", nargs="?", help="demo model name (same as --demo)")
    add_model_arguments(parser)
    parser.add_argument(
        "--depth", type=int, default=2, help="module path depth of the per-block table (2)"
    )
    parser.add_argument("--top", type=int, default=15, help="rows of the per-module tables")
    parser.add_argument("--plot", metavar="FILE.png", help="save a bar chart of saved bytes")
    parser.add_argument(
        "--save-graph",
        metavar="FILE.json",
        help="also write the solver DAG as node-link JSON (for remat solve FILE.json)",
    )


def run_profile(args: argparse.Namespace) -> int:
    """``remat profile``: per-module and per-block activation bytes, FLOPs and ranking."""
    if args.name:
        if args.demo or args.model:
            raise CaptureError("give the model once: a NAME, --demo or --model")
        demo_model(args.name)  # a demo model, or CaptureError naming them
        args.demo = args.name
    graph = capture_from_args(args)
    if args.save_graph:
        save_graph(graph.dag, args.save_graph)
        print(f"wrote {args.save_graph} ({graph.granularity} granularity)", file=sys.stderr)
    if graph.granularity != "op":
        args.granularity = "op"
        graph = capture_from_args(args)
    leaves = module_profile(graph)
    blocks = module_profile(graph, args.depth)
    saved = sum(r.saved_bytes for r in leaves)
    total = sum(r.activation_bytes for r in leaves)
    print(
        f"forward activations {human_bytes(total)}, saved for backward {human_bytes(saved)}; "
        f"static {human_bytes(sum(graph.static_bytes.values()))}"
    )
    by_saved = sorted(leaves, key=lambda r: -r.saved_bytes)[: args.top]
    print(format_table(by_saved, "\nper module (innermost), by saved bytes:"))
    print(format_table(blocks, f"\nper block (module depth {args.depth}), forward order:"))
    ranked = sorted((r for r in leaves if r.saved_bytes), key=lambda r: -r.saved_bytes_per_flop)
    print(
        format_table(
            ranked[: args.top],
            "\nbest to recompute (saved bytes per forward FLOP, high first):",
        )
    )
    if args.plot:
        plot_saved_bytes(
            blocks, args.plot, f"activation bytes per block: {args.demo or args.model}"
        )
        print(f"\nsaved {args.plot}")
    return 0
