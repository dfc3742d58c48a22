"""`remat solve`: arguments, the comparison table and the schedule file. No torch here.

The graph comes from the caller (a file, a built-in example or a captured model), so this module
only knows the solver; `cli.main` assembles the `remat` command.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import networkx as nx

from solver.core.budget import (
    BYTES,
    Budget,
    checkpoint_all_peak,
    human_bytes,
    hundred_percent,
    parse_compute_budget,
)
from solver.core.graph import Problem, prepare
from solver.core.link import Link, LinkError
from solver.core.schedule import Schedule
from solver.core.stages import cheapest_within, smallest_within
from solver.deadline import Deadline, Stop
from solver.errors import ArgumentError, InfeasibleBudgetError
from solver.exact import solve
from solver.exact.offload.search import OffloadProblem, solve_with_offload
from solver.exact.options import DEFAULT
from solver.exact.pipeline import check_arguments, print_interrupted
from solver.heuristics.registry import HEURISTICS, members
from solver.interrupt import first_sigint_stops
from solver.milp.cpsat import print_progress
from solver.target.devices import (
    BUILT_IN,
    HOST_LINKS,
    Device,
    builtin_device,
    is_device_file,
    named_link,
)


def add_solve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `remat solve` (the graph source options are added by the caller)."""
    parser.add_argument(
        "--budget",
        default=None,
        help="peak-memory budget: bytes, 512MiB, 1.5GiB or a percentage (default 80%%) of the "
        "measured peak of the plain training step (captured models: --model, --demo, and graph "
        "files saved from them), or, for a graph without that measurement (the published "
        "graphs), of the modelled checkpoint-all peak; the first line printed names the basis; "
        "or 'min': the least peak, then the least cost at it",
    )
    parser.add_argument(
        "--objective",
        choices=["cost", "memory"],
        default="cost",
        help="cost: least recompute under --budget; memory: least peak under --compute-budget",
    )
    parser.add_argument(
        "--compute-budget",
        default=None,
        help="for --objective memory or --budget min: 1.2 or 1.2x (times computing every node "
        "once) or an absolute cost in the graph's units, 0.02units",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=30.0,
        help="seconds for the whole command (default 30; from its start for a graph file, "
        "from the end of the capture for --model, which has as many of its own): the exact "
        f"solve ends by {100 * DEFAULT.shares.command_exact:.0f}%% of them and the heuristic "
        "rows by the end "
        "(with --no-baselines the solve gets all); Ctrl-C stops the search and prints what it "
        "found, a second Ctrl-C aborts",
    )
    parser.add_argument(
        "--offload",
        default=None,
        metavar="LINK",
        help="also solve with offload to host memory over LINK (docs/offload.md) and add its "
        f"row to the table: {', '.join(HOST_LINKS)}, a target ({', '.join(BUILT_IN)}: its "
        "host link), a device file (the link `remat calibrate` measured), or D2H,H2D[,HOST] "
        "in GB/s (10^9 bytes per second of the graph's costs) "
        "with HOST the host bytes (512GiB); a named link pairs with its device's seconds "
        "(a GPU's with --target or a GPU capture, the CPU's file with a CPU capture; other "
        "pairs are refused); the exact solves share their time, and --out writes the offload "
        "schedule",
    )
    parser.add_argument("--workers", type=int, default=8, help="CP-SAT workers (default 8)")
    parser.add_argument("--out", default=None, help="write the exact schedule to this JSON file")
    parser.add_argument(
        "--no-baselines",
        action="store_true",
        help="solve only; skip the heuristic rows of the table",
    )
    parser.add_argument("--quiet", action="store_true", help="no solver progress on stderr")


def parse_link(text: str) -> Link:
    """The link `--offload` names: a name of `HOST_LINKS`, a built-in target (its host link), a
    device file (its measured link), or D2H,H2D[,HOST] (GB/s, and host bytes as a budget
    spells them)."""
    key = text.strip().lower()
    if "," not in key:
        return named_link(text.strip())
    parts = [part.strip() for part in key.split(",")]
    if len(parts) not in (2, 3):
        raise LinkError(f"--offload {text!r}: expected D2H,H2D[,HOST] (GB/s, host bytes)")
    try:
        d2h, h2d = (float(part) * 1e9 for part in parts[:2])
    except ValueError as exc:
        raise LinkError(f"--offload {text!r}: the bandwidths must be numbers of GB/s") from exc
    host = _host_bytes(parts[2]) if len(parts) == 3 else None
    return Link(d2h, h2d, host)


@dataclass(frozen=True)
class _Owner:
    """A device as far as a host link is concerned: the kind of its kernels ("cpu", "cuda";
    None: unknown) and its name (a built-in target's or a device file's; None: unknown)."""

    kernels: str | None
    name: str | None


def _link_owner(text: str) -> _Owner | None:
    """The device whose link `--offload text` names: a GPU for a bus of `HOST_LINKS`, the
    target for a built-in target, the file's device for a device file; None for D2H,H2D
    (numbers in the graph's own units, owned by no device)."""
    key = text.strip().lower()
    if "," in key:
        return None
    if key in HOST_LINKS:
        return _Owner("cuda", None)
    if is_device_file(text.strip()):
        device = Device.load(text.strip())
        return _Owner(device.kernels, device.name)
    return _Owner("cuda", builtin_device(key).name)


def _graph_owner(graph: nx.DiGraph) -> tuple[_Owner, str] | None:
    """The device whose seconds the graph's costs are, and those seconds in words: the target
    of an estimate (graph attribute `target`), else the device a capture was measured on
    (`device`); None where the graph does not say (a published graph, one built in Python)."""
    target = graph.graph.get("target")
    if isinstance(target, str):
        kernels = "cpu" if target == "cpu" else "cuda" if target in BUILT_IN else None
        return _Owner(kernels, target), f"predicted for {target}"
    device = graph.graph.get("device")
    if isinstance(device, str):
        return _Owner(device, None), f"measured on {device}"
    return None


def offload_link(text: str, graph: nx.DiGraph) -> tuple[Link, str]:
    """The link `--offload text` names (`parse_link`) for a plan of `graph`, and one line for
    the table's header that says whose seconds and whose link the plan pairs. A link belongs
    with the seconds of the device it is attached to: LinkError, saying what to give instead,
    where the link is a device's (a name or a device file) and the graph's costs are another
    device's seconds (the graph attributes `target` and `device`) or no seconds at all
    (`cost_model` "flops"). D2H,H2D is in the graph's own units and pairs with any graph."""
    link = parse_link(text)
    rates = f"d2h {link.d2h / 1e9:g} GB/s, h2d {link.h2d / 1e9:g} GB/s"
    owner = _link_owner(text)
    if owner is None:
        return link, f"offload link: {rates} (10^9 bytes per unit of the graph's costs)"
    spelled = f"--offload {text.strip()}"
    whose = f"{owner.name}'s host link" if owner.name else "a GPU's host link"
    numbers = "or D2H,H2D in 10^9 bytes per unit of the graph's costs"
    if graph.graph.get("cost_model") == "flops":
        raise LinkError(
            f"{spelled} is bytes per second, and this graph's costs are FLOPs (--cost-model "
            f"flops): capture with --cost-model time, {numbers}"
        )
    seconds = _graph_owner(graph)
    if seconds is None:
        return link, (
            f"offload link: {whose}, {rates}, taken per unit of the graph's costs (the graph "
            "does not say which device's seconds they are)"
        )
    device, words = seconds
    names_differ = None not in (owner.name, device.name) and owner.name != device.name
    kinds_differ = None not in (owner.kernels, device.kernels) and owner.kernels != device.kernels
    if names_differ or kinds_differ:
        raise LinkError(
            f"{spelled} pairs with {owner.name or 'a GPU'}'s seconds, and this graph's seconds "
            f"are {words}: {_pairing_advice(owner, device)}, {numbers}"
        )
    return link, f"offload link: {whose}, {rates}; the graph's seconds {words}"


def _pairing_advice(link: _Owner, graph: _Owner) -> str:
    """What to give where a link of device `link` meets the seconds of device `graph`."""
    buses = ", ".join(HOST_LINKS)
    if graph.name in BUILT_IN:  # an estimate for a built-in GPU: its link, or a bus
        return f"give --offload {graph.name} (or a bus: {buses}) to pair with --target {graph.name}"
    if graph.name is not None:  # an estimate for the CPU or a device file: that file's link
        return f"give --offload the device file of `remat calibrate` for {graph.name}"
    if graph.kernels == "cpu":  # measured here
        target = link.name or f"GPU (one of {', '.join(BUILT_IN)})"
        return (
            f"add --target {target} to the capture (estimate mode: seconds predicted for the "
            "GPU), or give this machine's link: the device file of `remat calibrate --model "
            "M:F --out FILE`"
        )
    return f"give a GPU's link ({buses}, a built-in target's, or `remat calibrate --base`'s file)"


def _host_bytes(text: str) -> int:
    """The host bytes of --offload D2H,H2D,HOST: bytes or units, not a percentage."""
    wanted = Budget.of(text)
    if wanted.kind != BYTES:
        raise LinkError(f"--offload: give the host bytes (512GiB), not {text!r}")
    return wanted.bytes()


def _option(parameter: str, value: str | None = None) -> str:
    """The option of `solve`'s parameter, or the option given `value`: --budget, --budget min
    (`solver.exact.pipeline.check_arguments`)."""
    flag = "--" + parameter.replace("_", "-")
    return flag if value is None else f"{flag} {value}"


def _row(method: str, cost, total: float, peak, ref_peak: int, status: str, gap, seconds) -> str:
    cost_s = "-" if cost is None else f"{cost:.6g}"
    over = "-" if cost is None else f"{100 * (cost / total - 1):+.1f}%"
    peak_s = "-" if peak is None else f"{human_bytes(peak)} ({100 * peak / ref_peak:.0f}%)"
    gap_s = "-" if gap is None else f"{100 * gap:.2f}%"
    time_s = "-" if seconds is None else f"{seconds:.2f}s"
    return f"{method:<26} {cost_s:>12} {over:>9} {peak_s:>22} {status:>10} {gap_s:>7} {time_s:>8}"


def run_solve(args: argparse.Namespace, graph: nx.DiGraph, began: float | None = None) -> int:
    """Solve `graph` as `args` say, print the table (stdout) and write --out, all within
    `--time-limit` seconds of `began` (an instant on `time.perf_counter()`'s clock: the
    command's start, its imports and the graph's loading counted; None: now). Returns 0.

    One stop for the whole command: the first Ctrl-C ends the solve in progress (the
    keep/recompute one, the offload one, or the heuristic rows) and every later phase, and the
    table and --out are written with what was found; a second raises KeyboardInterrupt."""
    began = time.perf_counter() if began is None else began
    stop = Stop()
    with first_sigint_stops(stop, None if args.quiet else print_interrupted):
        return _solve_and_print(args, graph, began, stop)


def _solve_and_print(args: argparse.Namespace, graph: nx.DiGraph, began: float, stop: Stop) -> int:
    """`run_solve` with the command's `stop`, which every deadline below carries."""
    deadline = Deadline(began + args.time_limit, stop)
    share = 1 if args.no_baselines else DEFAULT.shares.command_exact
    exact_deadline = Deadline(began + share * args.time_limit, stop)
    exact_limit = exact_deadline.at - time.perf_counter()
    if exact_limit <= 0:
        raise ArgumentError(
            f"--time-limit {args.time_limit:g} s was spent before the solve began (starting, "
            f"imports and loading the graph took {time.perf_counter() - began:.1f} s); raise it"
        )
    problem = prepare(graph)
    ref_peak = _print_graph(graph, problem)
    given = (args.budget or "80%") if args.objective == "cost" else args.budget
    wanted = check_arguments(args.objective, given, args.compute_budget, args.offload, _option)
    link, pairing = (None, "") if args.offload is None else offload_link(args.offload, graph)
    offloaded: Schedule | None = None
    missing = ""  # the exact row's status where keep/recompute found no schedule
    if wanted is not None:  # objective cost
        if wanted.least:
            print("objective: the least peak, then the least cost at it")
            budget: Budget | int = wanted
        else:
            budget = wanted.bytes(lambda: ref_peak)
            print(f"objective: least cost with peak <= {human_bytes(budget)} ({budget} bytes)")
        if link is None:
            schedule = solve(
                graph,
                budget,
                compute_budget=args.compute_budget,
                time_limit=exact_limit,
                workers=args.workers,
                progress=not args.quiet,
                deadline=exact_deadline,
            )
        else:
            print(pairing)
            assert isinstance(budget, int)
            solved = solve_with_offload(
                OffloadProblem(graph, problem, budget, link),
                exact_deadline,
                workers=args.workers,
                progress=None if args.quiet else print_progress,
                keep_recompute=solve,
                keep_recompute_first=True,
            )
            schedule, offloaded = solved.keep_recompute, solved.schedule
            if solved.keep_recompute_error is not None:
                error = solved.keep_recompute_error
                print(f"keep/recompute: {error}")
                missing = "INFEASIBLE" if isinstance(error, InfeasibleBudgetError) else "NONE FOUND"
    else:
        limit = (
            None
            if args.compute_budget is None
            else parse_compute_budget(args.compute_budget, problem)
        )
        print(f"objective: least peak with cost <= {limit if limit is not None else 'unlimited'}")
        schedule = solve(
            graph,
            objective="memory",
            compute_budget=args.compute_budget,
            time_limit=exact_limit,
            workers=args.workers,
            progress=not args.quiet,
            deadline=exact_deadline,
        )
    _print_exact_rows(problem, ref_peak, schedule, missing, offloaded)
    schedule = schedule if offloaded is None else offloaded
    if args.out:  # before the rows: a second Ctrl-C there loses nothing
        schedule.save(args.out)
        print(f"\nschedule written to {args.out}", file=sys.stderr)
    if schedule.extra.get("interrupted"):
        print("(interrupted: no heuristic rows)")
    elif not args.no_baselines:
        _heuristic_rows(args, problem, schedule, ref_peak, deadline)
    return 0


def _print_graph(graph: nx.DiGraph, problem: Problem) -> int:
    """Print the graph's line (its size, checkpoint-all's peak and cost, the memory lower
    bound, what 100% is); returns 100% in bytes."""
    ref_peak, basis = hundred_percent(problem)
    name = graph.graph.get("name", "graph")
    print(
        f"{name}: {problem.n} nodes, {graph.number_of_edges()} edges, checkpoint-all peak "
        f"{human_bytes(checkpoint_all_peak(problem))}, cost {problem.total_cost:.6g}, memory "
        f"lower bound {human_bytes(problem.memory_lower_bound)}; 100% = {basis}, "
        f"{human_bytes(ref_peak)}"
    )
    return ref_peak


def _print_exact_rows(
    problem: Problem,
    ref_peak: int,
    schedule: Schedule | None,
    missing: str,
    offloaded: Schedule | None,
) -> None:
    """Print the table's header and its exact rows: keep/recompute's `schedule` (where None,
    a row of status `missing`) and, where given, the offload solve's with its copies."""
    print()
    print(
        f"{'method':<26} {'cost':>12} {'overhead':>9} {'peak (% of 100%)':>22} "
        f"{'status':>10} {'gap':>7} {'time':>8}"
    )
    if schedule is None:
        print(_row("exact", None, problem.total_cost, None, ref_peak, missing, None, None))
    else:
        print(_exact_row("exact", schedule, problem, ref_peak))
    if offloaded is not None:
        print(_exact_row("exact + offload", offloaded, problem, ref_peak))
        extra = offloaded.extra
        print(
            f"  offload over d2h {offloaded.link.d2h / 1e9:g} GB/s, h2d "
            f"{offloaded.link.h2d / 1e9:g} GB/s: {extra['offloads']} offloads, "
            f"{extra['reloads']} reloads, stall {extra['stall']:.6g}, host peak "
            f"{human_bytes(extra['host_peak'])}"
        )


def _exact_row(method: str, schedule: Schedule, problem: Problem, ref_peak: int) -> str:
    """The table's row of an exact solve."""
    return _row(
        method,
        schedule.cost,
        problem.total_cost,
        schedule.peak,
        ref_peak,
        schedule.status,
        schedule.gap,
        schedule.solve_seconds,
    )


def _heuristic_rows(
    args: argparse.Namespace, problem: Problem, schedule, ref_peak: int, deadline: Deadline
) -> None:
    """One row per heuristic of `solver.HEURISTICS` at the schedule's budget, all of them
    by `deadline`; "TIME" where it (or Ctrl-C) cut a heuristic short, and none after that."""
    budget = schedule.budget if args.objective == "cost" else None
    for method in HEURISTICS:
        heuristic = HEURISTICS[method]
        if not heuristic.applies(problem) or (budget is None and heuristic.at_budget):
            continue  # rotor off chains; eviction without a budget
        if deadline.passed():
            print(_row(method, None, problem.total_cost, None, ref_peak, "TIME", None, None))
            continue
        began = time.perf_counter()
        family = members(problem, budget, [method], deadline)[method]
        best = (
            cheapest_within(family, schedule.budget)
            if args.objective == "cost"
            else smallest_within(family, schedule.compute_budget)
        )
        seconds = time.perf_counter() - began
        status = "TIME" if deadline.passed() else "NO FIT"
        if best is None:
            print(_row(method, None, problem.total_cost, None, ref_peak, status, None, seconds))
            continue
        cost, peak = best.schedule.cost, best.schedule.peak
        print(_row(method, cost, problem.total_cost, peak, ref_peak, "HEURISTIC", None, seconds))
