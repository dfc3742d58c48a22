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

from benchmarks.gpu_check.driver import main
from benchmarks.gpu_check.reporting import describe, measure_link
from benchmarks.gpu_check.spec import RUNTIMES

__all__ = ["RUNTIMES", "describe", "main", "measure_link"]
