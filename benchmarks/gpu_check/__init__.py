"""One script for the first GPU: every runtime, with and without offload, on two models.

    python -m benchmarks.gpu_check --out gpu_check            # CUDA where available
    python -m benchmarks.gpu_check --device cpu --quick --out q  # small shapes, on the CPU

Models (`MODELS`, `DEFAULT_MODELS`; ``--quick``: small shapes for the CPU): a GPT-2 LM at
GPT-2's width and vocabulary with 4 layers (HF GPT2LMHeadModel from config, random init) and
a ResNet-50 (`benchmarks.zoo`, torchvision's layout); a Llama decoder stack at sequence 4096
(HF LlamaForCausalLM) with ``--models``. Each model's process runs deterministically
(`DETERMINISM`: ``torch.use_deterministic_algorithms(True)``, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
in its environment before torch is imported, cuDNN deterministic, its benchmark off), named in
the header. First the host link is measured on the device (`measure_link`; ``--link NAME``
uses a published one instead), then the structure step runs ``pytest -m "cuda and not long"``
(the tests of the CUDA paths but those that compile with inductor for minutes; the compile
cells run that path) on the device, its passed, failed and skipped counts a header line (not run on
the CPU, where they skip). Per model, one eager step as the reference and a second from a fresh
copy (eager's repeat: the eager row's grads say whether eager repeats itself bit for bit), the
capture (`graph_capture.capture`, ``granularity="module"``: the offload model grows as n^2,
docs/offload.md), then the cells (`RUNTIMES`):

- ``eager``: the model itself, the baseline;
- ``remat`` / ``remat+offload``: remat's own executor (`executor.Rematerialized` over the
  capture), solved by `solver.solve` at the midway budget without the link, and with it at
  the offload budget (`cells.offload_budget`: an eighth of the way from keep/recompute's least
  peak found down to the one-op floor, so that values must wait on the host);
- ``sac`` / ``sac+offload``: a SAC plan (`executor.checkpoint_plan(..., offload=None | link)`,
  then `CheckpointPlan.apply`) of the model itself, planned on the device (measured mode
  records where the model and inputs are: the device's op stream, bytes from its allocation
  events, seconds with it synchronized, its generator replayed); ``sac`` at the midway
  budget, ``sac+offload`` at the least plan with the link (below keep/recompute's least where
  a parked region gets there). SAC's per-copy offload overhead is measured on the device
  inside `checkpoint_plan`, with the runtime's own copies (the sac+offload row says so);
- ``compile``: `executor.compile` (inductor on CUDA; ``aot_eager`` on the CPU, where inductor
  compiles for tens of seconds per model) at the own executor's midway budget in bytes plus
  the parameters' gradients (which the compiled step creates, where the own executor's budget
  has them allocated before the step), for ``--compile-models`` (default ``gpt2``; the
  others' compile cells are skipped);
- ``compile+offload``: `executor.compile(..., offload=link)` at the offload budget: on CUDA
  emitted as torch's ``ao.offload`` / ``ao.reload`` ops (`executor.compiled.offload`; never
  run before this script: docs/compile.md); on the CPU the call refuses in one line (the ops
  need an accelerator), and that line is the cell.

Per cell: predicted peak (the schedule's or plan's, bytes), measured peak (CUDA:
`torch.cuda.max_memory_allocated` after a reset; CPU: the profiler's allocation events,
`executor.measure_peak`; SAC with offload on the CPU: `executor.sac.runtime.offload.measure_split`'s
device part), predicted step seconds (`predicted_s`: the capture's op seconds summed for eager,
the schedule's cost, compute plus the link's stall, for the own executor, that plain sum (of
the runtime's model, not SAC's) plus the plan's cost for SAC, the compiled regions' cost for
compile), measured step seconds (median of ``--steps`` steps after one warm-up, CUDA
synchronized), the gradient check against the reference step (loss, every ``.grad``, every
buffer: bit for bit, `torch.equal` on the bits, for the own executor and SAC; `torch.allclose`
under inductor; where eager does not repeat itself, within eager's own spread per tensor),
copies (the offload ops, SAC's offloaded ops and parked regions) and host bytes (predicted;
measured by the own executor's `HostPool` and on the CPU by `measure_split`). Each cell is
``ok``, ``WRONG: <what differs>`` (only where eager repeats itself; exit status 1),
``UNSURE: <what differs beyond eager's spread>``, ``no copy: <why>`` (an offload cell whose
plan moves nothing: not an offload check), ``skipped: <why>`` or ``refused: <the error's type
and first line>``.

Every phase runs under its own time limit (``LIMITS`` times ``--limit-scale``; solves and
recordings get a share of it), each model in its own subprocess (a crash or a hang loses that
model's remaining cells, recorded as refused with the reason, and the others go on). The most
the run can take (`run_budget`: the link, the structure step, each model's limits) is printed
before it starts, and a run whose limits add up to more than ``--max-seconds`` (600) is
refused: the defaults add up to 585 s. The table is written after each model (``--out``:
``gpu_check.md`` and ``gpu_check.json``).
"""

from benchmarks.gpu_check.driver import main
from benchmarks.gpu_check.reporting import describe, measure_link
from benchmarks.gpu_check.spec import RUNTIMES

__all__ = ["RUNTIMES", "describe", "main", "measure_link"]
