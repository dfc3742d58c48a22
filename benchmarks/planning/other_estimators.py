"""What other tools' memory estimators say for the configurations `remat estimate` answers, by
their published formulas, beside remat's rows: what each leaves out.

    python -m benchmarks.planning.other_estimators [--only llama3_8b llama3_70b]

The formulas, read from the tools' sources (not run: neither is a dependency here):

- accelerate's `accelerate estimate-memory` (`accelerate/commands/estimate.py`,
  `estimate_training_usage`, accelerate 1.16): "Training using Adam" in bfloat16 mixed
  precision is the most of the model (4 bytes a parameter), gradients (6), Adam's states (8)
  and the step (8): 8 bytes a parameter on one device, whatever the batch, sequence or number
  of devices, with no activations.
- DeepSpeed's `estimate_zero3_model_states_mem_needs` (`deepspeed/runtime/zero/stage3.py`,
  DeepSpeed 0.19.8), ZeRO-3 without offload: per GPU 4 bytes a parameter of the largest layer
  (the module holding the most parameters of its own) plus 18 bytes a parameter over the GPUs;
  model states only, activations left out by design.

remat's rows are `executor.estimate` on the same meta model (`scale_llama.build`, FSDP2 as
`scale_llama.policy`), in GiB per rank.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks.planning.estimate_speed import MAIN
from benchmarks.planning.scale_llama import GIB, RUNS, build, policy


def parameter_counts(model) -> tuple[int, int]:
    """(parameters, each shared one once; the most parameters any one module holds of its own)."""
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def accelerate_training_bytes(parameters: int) -> int:
    """accelerate estimate-memory's "Training using Adam" in bfloat16: 8 bytes a parameter."""
    return 8 * parameters


def deepspeed_zero3_gpu_bytes(parameters: int, largest: int, gpus: int) -> int:
    """DeepSpeed's ZeRO-3 model states per GPU without offload."""
    return 4 * largest + 18 * parameters // gpus


def main(argv: Sequence[str] | None = None) -> None:
    import executor

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), default=list(MAIN))
    parser.add_argument("--time-limit", type=float, default=120)
    args = parser.parse_args(argv)
    print(
        "| model | ranks | accelerate (one device) | DeepSpeed ZeRO-3 model states | "
        "remat: model states + FSDP buffers | remat: activations | remat: none | remat: full "
        "| remat: plan (fits?) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.only:
        model, ids, kwargs = build(name)
        total, largest = parameter_counts(model)
        device, fsdp = policy(name)
        est = executor.estimate(
            model, (ids,), example_kwargs=kwargs, target=device, fsdp=fsdp,
            time_limit=args.time_limit,
        )  # fmt: skip
        none = est.strategy("none").components
        full, plan = est.strategy("full"), est.strategy("remat")
        states = none.parameters + none.optimizer_states + none.fsdp_buffers + none.gradients
        plan_cell = "none fits" if plan.total is None else f"{plan.total / GIB:.2f}"
        verdict = "yes" if plan.total is not None and plan.total <= est.usable else "no"
        print(
            f"| {name} | {fsdp.world_size} | {accelerate_training_bytes(total) / GIB:.2f} | "
            f"{deepspeed_zero3_gpu_bytes(total, largest, fsdp.world_size) / GIB:.2f} | "
            f"{states / GIB:.2f} | {(none.saved_activations + none.transient) / GIB:.2f} | "
            f"{none.total / GIB:.2f} | {full.total / GIB:.2f} | {plan_cell} ({verdict}) |"
        )


if __name__ == "__main__":
    main()
