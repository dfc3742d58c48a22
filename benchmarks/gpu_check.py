"""One script for the first GPU: every runtime, with and without offload, on three models.

    python -m benchmarks.gpu_check --out gpu_check            # CUDA where available
    python -m benchmarks.gpu_check --device cpu --quick --out q  # small shapes, on the CPU

Models (`MODELS`; ``--quick``: small shapes for the CPU): a GPT-2-size LM (HF GPT2LMHeadModel
from config, random init), a Llama decoder stack at sequence 4096 (HF LlamaForCausalLM) and a
ResNet-50 (`benchmarks.zoo`, torchvision's layout). First the host link is measured on the
device (`measure_link`; ``--link NAME`` uses a published one instead). Per model, after the capture
(`graph_capture.capture`, ``granularity="module"``: the offload model grows as n^2, docs/offload.md)
and one eager step as the reference, the cells (`RUNTIMES`):

- ``eager``: the model itself, the baseline (its gradient check: eager against itself);
- ``remat`` / ``remat+offload``: remat's own executor (`executor.Rematerialized` over the
  capture, solved at the midway budget by `solver.solve(..., offload=None | link)`);
- ``sac`` / ``sac+offload``: a SAC plan (`executor.checkpoint_plan(..., offload=None | link)`,
  then `CheckpointPlan.apply`); on CUDA it is planned in estimate mode for ``--target`` (the
  recording runs on the CPU only: docs/sac.md), then applied to the model on the GPU;
- ``compile``: `executor.compile` (inductor on CUDA; ``aot_eager`` on the CPU, where inductor
  compiles for tens of seconds per model) at the own executor's budget in bytes;
- ``compile+offload``: `executor.compile(..., offload=link)` at the same budget: on CUDA the
  schedules may offload, emitted as torch's ``ao.offload`` / ``ao.reload`` ops
  (`executor.compiled.offload`; never run before this script: docs/compile.md); on the CPU the
  call refuses in one line (the ops need an accelerator), and that line is the cell.

Budgets as `benchmarks.running.breadth` defines ``mid``: halfway between the least peak found
(objective "memory", time-limited, so an upper bound of the least) and the checkpoint-all peak
for the own executor; halfway between the plan at "min" and the plan without checkpointing for
SAC. Per cell: predicted peak (the schedule's or plan's, bytes), measured peak (CUDA:
`torch.cuda.max_memory_allocated` after a reset; CPU: the profiler's allocation events,
`executor.measure_peak`; SAC with offload on the CPU: `executor.sac.offload.measure_split`'s
device part), predicted step seconds (`predicted_s`: the capture's op seconds summed for eager,
the schedule's cost, compute plus the link's stall, for the own executor, that plain sum plus
the plan's cost for SAC, the compiled regions' cost for compile), measured step seconds (median
of ``--steps`` steps after one warm-up, CUDA synchronized), the gradient check against the
reference step (loss, every ``.grad``, every buffer: bit for bit, `torch.equal` on the bits, for
eager, the own executor and SAC; `torch.allclose` under inductor) and host bytes (predicted;
measured by the own executor's `HostPool` and on the CPU by `measure_split`). Each cell is a
result or ``refused: <the error's type and first line>``, or ``WRONG: <what differs>``.

Every cell runs under its own time limit (``LIMITS`` times ``--limit-scale``; solves and
recordings get a share of it), each model in its own subprocess (a crash or a hang loses that
model's remaining cells, recorded as refused with the reason, and the others go on). The most
the run can take is printed before it starts, and a run whose limits add up to more than
``--max-seconds`` is refused. The table is written after each model (``--out``:
``gpu_check.md`` and ``gpu_check.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from benchmarks.running.breadth_report import _refusal
from benchmarks.running.breadth_steps import first_difference
from benchmarks.running.compile_partition import ignore_hf_logging
from benchmarks.zoo import Bench, gpt2, llama, resnet50

SEED = 1234
RUNTIMES = (
    "eager",
    "remat",
    "remat+offload",
    "sac",
    "sac+offload",
    "compile",
    "compile+offload",
)
QUICK_LINK_BYTES = 16 << 20
"""Bytes per timed host-link copy with ``--quick`` (small shapes: their values are KiB)."""
LIMITS = {
    "setup": 20.0,
    "capture": 30.0,
    "eager": 10.0,
    "remat": 15.0,
    "remat+offload": 25.0,
    "sac": 25.0,
    "sac+offload": 15.0,
    "compile": 30.0,
    "compile+offload": 15.0,
}
"""Seconds per phase of a model: ``setup`` (the subprocess's imports, the model, the reference
step), ``capture``, then each cell; `--limit-scale` multiplies them all."""


@dataclass(frozen=True)
class ModelSpec:
    """A model at its GPU shape and its CPU ``--quick`` shape (each a `Bench` factory)."""

    full: Callable[[], Bench]
    quick: Callable[[], Bench]
    description: str


MODELS: dict[str, ModelSpec] = {
    "gpt2": ModelSpec(
        lambda: gpt2(layers=12, hidden=768, heads=12, batch=4, seq=1024, vocab=50257),
        lambda: gpt2(layers=2, hidden=64, heads=2, batch=2, seq=32, vocab=256),
        "GPT2LMHeadModel, 12 layers, width 768, vocabulary 50257, batch 4 x 1024 (124M "
        "parameters); --quick: 2 layers, width 64, batch 2 x 32",
    ),
    "llama": ModelSpec(
        lambda: llama(layers=4, hidden=1024, heads=16, kv_heads=4, batch=1, seq=4096, vocab=32000),
        lambda: llama(layers=2, hidden=64, heads=2, kv_heads=1, batch=1, seq=64, vocab=256),
        "LlamaForCausalLM, 4 decoder layers, width 1024, 16 heads (4 KV), vocabulary 32000, "
        "batch 1 x 4096; --quick: 2 layers, width 64, batch 1 x 64",
    ),
    "resnet50": ModelSpec(
        lambda: resnet50(batch=32, image=224, classes=1000),
        lambda: resnet50(batch=2, image=32, width=8),
        "ResNet-50 (torchvision's layout), batch 32 of 224x224, 1000 classes; --quick: batch 2 "
        "of 32x32, width 8",
    ),
}


@dataclass
class Cell:
    """One runtime on one model. Bytes, seconds; None where not measured or not predicted.
    ``result``: ``ok``, ``WRONG: ...`` or ``refused: ...``; ``grads``: ``bit-equal``,
    ``allclose`` or what differs; ``copies``: the own executor's offload ops, SAC's offloaded
    ops and parked regions."""

    model: str
    runtime: str
    result: str = ""
    budget: int | None = None
    status: str | None = None
    predicted_peak: int | None = None
    measured_peak: int | None = None
    predicted_s: float | None = None
    measured_s: float | None = None
    grads: str | None = None
    host_predicted: int | None = None
    host_measured: int | None = None
    copies: str | None = None
    seconds: float = 0.0


class CellTimeout(Exception):
    """A cell ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise `CellTimeout` in the main thread once `seconds` have passed (SIGALRM; Python code
    only: a C++ call returns first)."""

    def expire(signum: int, frame: object) -> None:
        raise CellTimeout(f"{what} ran past its limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Run:
    """One model on one device: the pristine model (CPU), its inputs on the device, the
    reference step, the link, and what the cells share (the capture, budgets)."""

    name: str
    bench: Bench
    device: torch.device
    link_name: str
    target: str | None
    backend: str
    steps: int
    scale: float
    inputs: tuple[torch.Tensor, ...] = ()
    reference: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)

    def limit(self, phase: str) -> float:
        return LIMITS[phase] * self.scale

    def fresh(self) -> nn.Module:
        """A copy of the pristine model on the device."""
        return copy.deepcopy(self.bench.model).to(self.device)

    def step(self, module: Callable) -> torch.Tensor:
        """One training step of `module` from the seed: the loss, after its backward."""
        torch.manual_seed(SEED)
        loss = module(*self.inputs)
        loss.backward()
        return loss

    def state(self, model: nn.Module, loss: torch.Tensor) -> dict:
        """The loss, every `.grad` and every buffer, cloned."""
        out = {"loss": loss.detach().clone()}
        for name, p in model.named_parameters():
            out[f".grad of {name}"] = None if p.grad is None else p.grad.clone()
        out |= {f"buffer {name}": b.clone() for name, b in model.named_buffers()}
        return out

    def check(self, module: Callable, model: nn.Module, exact: bool) -> str:
        """The step of `module` (training `model`) from `.grad` None against the reference:
        ``bit-equal``/``allclose``; `Mismatch` where a tensor differs."""
        model.zero_grad(set_to_none=True)
        got = self.state(model, self.step(module))
        model.zero_grad(set_to_none=True)
        if exact:
            difference = first_difference(self.reference, got)
            if difference:
                raise Mismatch(difference)
            return "bit-equal"
        for key, want in self.reference.items():
            have = got.get(key)
            if (want is None) != (have is None) or (
                want is not None and not torch.allclose(want, have, rtol=1e-3, atol=1e-5)
            ):
                raise Mismatch(f"{key} not allclose (rtol 1e-3, atol 1e-5)")
        return "allclose"

    def synchronized(self, module: Callable) -> Callable[[], None]:
        def run() -> None:
            self.step(module)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        return run

    def measure(self, cell: Cell, module: Callable, model: nn.Module, grads_before: bool) -> None:
        """The measured peak of one step (`.grad` allocated before it where `grads_before`, as
        the own executor states its budget, else None) and the median step seconds."""
        from executor import measure_peak, median_seconds

        model.zero_grad(set_to_none=True)
        if grads_before:
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
        with torch.random.fork_rng(devices=_rng_devices(self.device)):
            cell.measured_peak = measure_peak(self.synchronized(module), self.device).peak_bytes
            cell.measured_s = median_seconds(self.synchronized(module), self.steps, warmup=1)
        model.zero_grad(set_to_none=True)


class Mismatch(Exception):
    """The runtime's step differs from the reference."""


def _rng_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def setup(run: Run) -> None:
    """The inputs on the device and the reference step (eager, from `.grad` None)."""
    run.inputs = tuple(t.to(run.device) for t in run.bench.inputs)
    model = run.fresh()
    with torch.random.fork_rng(devices=_rng_devices(run.device)):
        run.reference = run.state(model, run.step(model))


def capture_phase(run: Run) -> None:
    """Capture the model on the device (module granularity) and solve the least peak within a
    share of the limit: the own executor's midway budget."""
    import solver
    from graph_capture import capture

    model = run.fresh()
    repeats = 3 if run.device.type == "cuda" else 2
    captured = capture(model, run.inputs, granularity="module", repeats=repeats)
    problem = solver.prepare(captured.dag)
    full = solver.checkpoint_all_peak(problem)
    least = solver.solve(captured.dag, objective="memory", time_limit=run.limit("capture") / 4)
    run.shared.update(
        captured=captured,
        model=model,
        budget=(least.peak + full) // 2,
        plain_s=problem.total_cost,
    )


def eager_cell(run: Run, cell: Cell) -> None:
    model = run.fresh()
    cell.predicted_s = run.shared.get("plain_s")
    cell.grads = run.check(model, model, exact=True)
    run.measure(cell, model, model, grads_before=True)


def remat_cell(run: Run, cell: Cell, offload: bool) -> None:
    import solver
    from executor import Rematerialized
    from solver.target.devices import named_link

    if "captured" not in run.shared:
        raise RuntimeError("no capture (see the capture's failure)")
    captured, model = run.shared["captured"], run.shared["model"]
    cell.budget = run.shared["budget"]
    link = named_link(run.link_name) if offload else None
    schedule = solver.solve(
        captured.dag, cell.budget, time_limit=run.limit(cell.runtime) / 2, offload=link
    )
    rm = Rematerialized(model, captured, schedule)
    cell.status = schedule.status
    cell.predicted_peak, cell.predicted_s = schedule.peak, schedule.cost
    if offload:
        cell.host_predicted = schedule.extra.get("host_peak", 0)
        cell.copies = f"{sum(kind == 'offload' for kind, _ in schedule.ops)} offloads"
    cell.grads = run.check(rm, model, exact=True)
    if rm.host_pool is not None:
        rm.host_pool.reset_peak()
    run.measure(cell, rm, model, grads_before=True)
    if rm.host_pool is not None:
        cell.host_measured = rm.host_pool.peak_bytes


def sac_cell(run: Run, cell: Cell, offload: bool) -> None:
    import executor

    planned = copy.deepcopy(run.bench.model)  # recorded on the CPU, or estimated for a target

    def plan_at(budget: str | int, link: str | None, share: float) -> executor.CheckpointPlan:
        return executor.checkpoint_plan(
            planned,
            run.bench.inputs,
            budget,
            time_limit=run.limit(cell.runtime) * share,
            target=run.target,
            offload=link,
        )

    if "sac_budget" not in run.shared:
        least = plan_at("min", None, 0.4)
        run.shared["sac_budget"] = (least.peak + least.plain_peak) // 2
    cell.budget = run.shared["sac_budget"]
    plan = plan_at(cell.budget, run.link_name if offload else None, 0.4)
    cell.status, cell.predicted_peak = plan.status, plan.peak
    plain_s = run.shared.get("plain_s")
    cell.predicted_s = None if plain_s is None else plain_s + plan.cost
    if offload:
        cell.host_predicted = plan.host
        ops, parked = sum(len(o) for o in plan.offloads()), sum(plan.plain_offloads())
        cell.copies = f"{ops} ops, {parked} regions parked"
    model = plan.apply(run.fresh())
    cell.grads = run.check(model, model, exact=True)
    run.measure(cell, model, model, grads_before=False)
    if offload and run.device.type == "cpu":
        from executor.sac.offload import measure_split

        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng(devices=[]):
            split = measure_split(lambda: run.step(model))
        model.zero_grad(set_to_none=True)
        cell.measured_peak, cell.host_measured = split.device, split.host


def compile_cell(run: Run, cell: Cell, offload: bool) -> None:
    import executor
    from solver.target.devices import named_link

    model = run.fresh()
    cell.budget = run.shared.get("budget")
    if cell.budget is None:
        raise RuntimeError("no budget: the capture failed (see its cell)")
    extra = {"offload": named_link(run.link_name)} if offload else {}
    cm = executor.compile(
        model,
        run.inputs,
        cell.budget,
        time_limit=run.limit(cell.runtime) * 0.8,
        max_compiles=2,
        backend=run.backend,
        **extra,
    )
    regions = cm.remat.regions
    if offload:
        ops = [kind for r in regions for kind, _ in r.schedule.ops]
        cell.copies = f"{ops.count('offload')} offloads, {ops.count('reload')} reloads"
    cell.predicted_peak = max(r.schedule.peak for r in regions)
    cell.predicted_s = sum(r.cost for r in regions)
    cell.status = ", ".join(sorted({r.schedule.status for r in regions}))
    cell.grads = run.check(cm, model, exact=run.backend == "aot_eager")
    run.measure(cell, cm, model, grads_before=False)


CELLS: dict[str, Callable[[Run, Cell], None]] = {
    "eager": eager_cell,
    "remat": lambda run, cell: remat_cell(run, cell, offload=False),
    "remat+offload": lambda run, cell: remat_cell(run, cell, offload=True),
    "sac": lambda run, cell: sac_cell(run, cell, offload=False),
    "sac+offload": lambda run, cell: sac_cell(run, cell, offload=True),
    "compile": lambda run, cell: compile_cell(run, cell, offload=False),
    "compile+offload": lambda run, cell: compile_cell(run, cell, offload=True),
}


def guarded(run: Run, cell: Cell, phase: str, work: Callable[[], None]) -> Cell:
    """Run `work` under the phase's time limit; any failure becomes the cell's result."""
    start = time.perf_counter()
    try:
        with time_limit(run.limit(phase), f"{run.name} {phase}"):
            work()
        cell.result = "ok"
    except Mismatch as wrong:
        cell.result = f"WRONG: {wrong}"
    except Exception as error:
        cell.result = _refusal(error)
    cell.seconds = time.perf_counter() - start
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    return cell


def model_cells(run: Run) -> Iterator[Cell]:
    """The setup and capture phases (reported as cells only where they fail), then each
    runtime's cell, in order."""
    for phase, work in (("setup", setup), ("capture", capture_phase)):
        done = guarded(run, Cell(run.name, phase), phase, lambda w=work: w(run))
        if done.result != "ok":
            yield done
            if phase == "setup":
                return
    for runtime in RUNTIMES:
        cell = Cell(run.name, runtime)
        yield guarded(run, cell, runtime, lambda c=cell: CELLS[c.runtime](run, c))


def model_budget(scale: float) -> float:
    """The most seconds one model's subprocess may take: its phases' limits."""
    return sum(LIMITS.values()) * scale


def compile_backend(device: str) -> str:
    """The compile cell's backend: inductor on CUDA; aot_eager on the CPU, where inductor
    compiles for tens of seconds per model (FIELD-NOTES) and the check is bit for bit."""
    return "inductor" if device == "cuda" else "aot_eager"


def _worker(args: argparse.Namespace) -> int:
    if args.device == "cpu":
        torch.set_num_threads(1)
    spec = MODELS[args.worker]
    torch.manual_seed(0)
    run = Run(
        args.worker,
        (spec.quick if args.quick else spec.full)(),
        torch.device(args.device),
        args.link,
        args.target if args.device == "cuda" else None,
        compile_backend(args.device),
        args.steps,
        args.limit_scale,
    )
    ignore_hf_logging()
    for cell in model_cells(run):
        print("CELL " + json.dumps(asdict(cell)), flush=True)
    return 0


def run_model(name: str, args: argparse.Namespace) -> list[Cell]:
    """One model's cells, in a subprocess under its limits; a cell it did not report (a crash,
    a hang) is refused with the reason."""
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--worker", name]
    command += ["--device", args.device, "--link", args.link, "--target", args.target]
    command += ["--steps", str(args.steps), "--limit-scale", str(args.limit_scale)]
    command += ["--quick"] if args.quick else []
    timeout = model_budget(args.limit_scale)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        out = done.stdout
        tail = done.stderr.strip().splitlines()[-1:] if done.returncode else []
        reason = f"refused: the worker exited with status {done.returncode}"
        reason += f": {tail[0]}" if tail else ""
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        reason = f"refused: the model's worker ran past {timeout:g} s"
    lines = (out or "").splitlines()
    cells = [Cell(**json.loads(line[5:])) for line in lines if line.startswith("CELL ")]
    reported = {c.runtime for c in cells}
    cells += [Cell(name, r, reason) for r in RUNTIMES if r not in reported]
    return cells


COLUMNS = (
    "model",
    "runtime",
    "result",
    "budget",
    "status",
    "predicted peak",
    "measured peak",
    "measured / predicted",
    "predicted s",
    "measured s",
    "grads",
    "host predicted",
    "host measured",
    "copies",
    "seconds",
)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f} MiB"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.2f} ms"


def row(cell: Cell) -> str:
    ratio = (
        f"{cell.measured_peak / cell.predicted_peak:.4f}"
        if cell.measured_peak is not None and cell.predicted_peak
        else "-"
    )
    values = (
        cell.model,
        cell.runtime,
        cell.result.replace("|", "\\|"),
        _mib(cell.budget),
        cell.status or "-",
        _mib(cell.predicted_peak),
        _mib(cell.measured_peak),
        ratio,
        _s(cell.predicted_s),
        _s(cell.measured_s),
        cell.grads or "-",
        _mib(cell.host_predicted),
        _mib(cell.host_measured),
        cell.copies or "-",
        f"{cell.seconds:.1f}",
    )
    return "| " + " | ".join(values) + " |"


def report(cells: Sequence[Cell], header: Sequence[str]) -> str:
    """The markdown report: what ran, then one table."""
    lines = [*header, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + [row(c) for c in cells]) + "\n"


def measure_link(args: argparse.Namespace) -> Path:
    """``--link measured``: the host link measured on ``--device``
    (`graph_capture.measurement.link`: pinned memory, a side stream and CUDA events on CUDA; a
    copy into a host pool on the CPU), saved as ``link.json`` in ``--out`` (a device file:
    ``--target``'s published figures on CUDA, this processor's on the CPU, with the measured
    link), which the workers read by path. Copies of `LINK_BYTES`, `QUICK_LINK_BYTES` with
    ``--quick``."""
    import dataclasses

    from graph_capture.measurement.link import LINK_BYTES, measure_host_link
    from graph_capture.measurement.roofline import cpu_device
    from solver.target.devices import builtin_device

    base = builtin_device(args.target) if args.device == "cuda" else cpu_device()
    nbytes = QUICK_LINK_BYTES if args.quick else LINK_BYTES
    device = dataclasses.replace(base, host_link=measure_host_link(args.device, nbytes))
    path = args.out / "link.json"
    device.save(path)
    return path


def describe(args: argparse.Namespace, measured: Path | None) -> list[str]:
    """The run's header lines: command, device, link, models, the most it can take."""
    from solver.target.devices import named_link

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU, one thread"
    models = args.models or list(MODELS)
    cuda = args.device == "cuda"
    planned = f"estimate mode for target {args.target}" if cuda else "recorded here"
    backend = compile_backend(args.device)
    if measured is None:
        link = named_link(args.link)
        source = "the published figure (`solver.target.devices.named_link`)"
    else:
        link = named_link(str(measured))
        published = named_link(args.target)
        how = "pinned, a side stream, CUDA events" if cuda else "a copy into a host pool"
        source = (
            f"measured here ({how}; `{measured.name}`); {args.target}'s published figure: "
            f"{published.d2h / 1e9:g} and {published.h2d / 1e9:g} GB/s"
        )
    return [
        f"`python -m benchmarks.gpu_check {' '.join(args.argv)}`".replace(" `", "`"),
        "",
        f"- device: {args.device} ({device}), torch {torch.__version__}",
        f"- link `{args.link}`: {link.d2h / 1e9:g} GB/s device-to-host, {link.h2d / 1e9:g} GB/s "
        f"host-to-device, {source}",
        f"- SAC plans: {planned}; compile backend: {backend}",
        f"- shapes: {'--quick' if args.quick else 'full'}; "
        + "; ".join(f"{m}: {MODELS[m].description}" for m in models),
        f"- at most {model_budget(args.limit_scale) * len(models):.0f} s "
        f"({len(models)} models x {model_budget(args.limit_scale):.0f} s of phase limits)",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__.split("\n")[0]
    )
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if cuda else "cpu")
    parser.add_argument("--quick", action="store_true", help="small shapes (for the CPU)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), help="default: all")
    parser.add_argument(
        "--link",
        default="measured",
        help="host link: 'measured' (default: measured on --device, saved as link.json in "
        "--out), a link or target name (h100, pcie5) or a device file",
    )
    parser.add_argument("--target", default="h100", help="SAC's estimate target on CUDA")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per cell (median)")
    parser.add_argument("--limit-scale", type=float, default=1.0, help="times every limit")
    parser.add_argument("--max-seconds", type=float, default=570, help="refuse runs past this")
    parser.add_argument("--out", type=Path, default=Path("gpu_check"), help="output folder")
    parser.add_argument("--worker", choices=list(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.device == "cuda" and not cuda:
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu --quick")
    if args.steps < 1 or args.limit_scale <= 0:
        parser.error("--steps must be at least 1 and --limit-scale positive")
    if args.worker:
        return _worker(args)
    models = args.models or list(MODELS)
    most = model_budget(args.limit_scale) * len(models)
    if most > args.max_seconds:
        parser.error(
            f"the phase limits add up to {most:.0f} s, over --max-seconds {args.max_seconds:g}: "
            "lower --limit-scale or run fewer --models"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    measured = measure_link(args) if args.link == "measured" else None
    header = describe(args, measured)
    if measured is not None:
        args.link = str(measured)  # the workers read the measured link by path
    print("\n".join(header), flush=True)
    cells: list[Cell] = []
    for name in models:
        for cell in run_model(name, args):
            cells.append(cell)
            print(row(cell), flush=True)
        (args.out / "gpu_check.md").write_text(report(cells, header))
        (args.out / "gpu_check.json").write_text(
            json.dumps({"header": header, "cells": [asdict(c) for c in cells]}, indent=1)
        )
    return 1 if any(c.result.startswith("WRONG") for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
