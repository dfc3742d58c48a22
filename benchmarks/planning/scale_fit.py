"""Llama-3-8B under FSDP2 over 8 H100s (estimate mode): the largest local batch (sequence 8192)
and the largest sequence (batch 1, in multiples of 1024) each policy fits in what the target lets
PyTorch allocate per rank (`Device.usable`).

    python -m benchmarks.planning.scale_fit [--out results] [--dims batch seq]
        [--policies sac remat]

- no checkpointing, full per-block, torchtitan's selective op and the SAC plan: per size one
  SAC recording (`benchmarks.planning.scale_llama.part_plan` at budget "min", its own child
  process):
  each policy's predicted per-rank peak (the SAC plan's: the least any plan reaches) against
  the device's usable bytes. Sizes double from 1 until one does not fit, then
  `solver.fitting.sizes.largest_between` bisects; every size recorded is kept, so the
  policies share them.
- remat's own schedule: `executor.fit(factory, usable, dim, target="h100", world_size=8)` with
  the same FSDP policy, captured at sizes 2, 3, 4 (sequence: 2048, 3072, 4096), at op level or
  module level (`--granularity`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.planning import scale_llama
from solver.fitting.sizes import DOES_NOT_FIT, FITS, largest_between

NAME = "llama3_8b"
SEQ_UNIT = 1024
POLICIES = ("none", "full", "selective (torchtitan)", "SAC plan (remat)")


def _size(dim: str, n: int) -> tuple[int, int]:
    return (n, 8192) if dim == "batch" else (1, n * SEQ_UNIT)


def sac_fits(dim: str, time_limit: float, most: int, layers: int | None = None) -> dict:
    """Per SAC policy, the largest size whose predicted per-rank peak fits, and each size's
    peaks (GiB); `layers`: decoder layers (None: the model's)."""
    device, fsdp = scale_llama.policy(NAME)
    usable = device.usable(fsdp.nccl_communicators)
    seen: dict[int, dict] = {}

    def record(n: int) -> dict:
        if n not in seen:
            b, s = _size(dim, n)
            args = ["--part", "plan", "--name", NAME, "--time-limit", str(time_limit)]
            args += ["--size", str(b), str(s), "--budget", "min"]
            args += [] if layers is None else ["--layers", str(layers)]
            seen[n] = scale_llama._child(args, 600)
        return seen[n]

    out = {}
    for label in POLICIES:

        def decide(n: int, label: str = label) -> str | None:
            got = record(n)
            if "error" in got:
                return None
            return FITS if got["rows"][label]["peak"] <= usable else DOES_NOT_FIT

        fits, fails = 0, None
        n = 1
        while fails is None and n <= most:
            verdict = decide(n)
            if verdict is None:
                break
            fits, fails = (n, None) if verdict == FITS else (fits, n)
            n *= 2
        if fails is None:
            out[label] = {"largest": fits, "closed": False}
            continue
        fits, fails, closed = largest_between(decide, fits, fails)
        out[label] = {"largest": fits, "closed": closed}
    peaks = {
        n: {k: v["peak"] / scale_llama.GIB for k, v in got.get("rows", {}).items()}
        for n, got in sorted(seen.items())
    }
    errors = {n: got["error"] for n, got in seen.items() if "error" in got}
    return {"policies": out, "peaks GiB": peaks, "errors": errors}


def remat_fit(
    dim: str,
    time_limit: float,
    granularity: str = "op",
    layers: int | None = None,
    offload: str | None = None,
    name: str = NAME,
    memory: int | None = None,
) -> dict:
    """`executor.fit`'s answer for remat's own schedule on `scale_llama.RUNS[name]`, captured at
    `granularity`, with `layers` decoder layers (None: the model's), in `memory` bytes per rank
    (None: what the target lets PyTorch allocate), offloading over the link `offload` names
    (None: keep/recompute): the size (in `dim`'s units: batch rows, or tokens), proven or up to
    which size open, the host peak at it, and the summary."""
    import executor

    device, fsdp = scale_llama.policy(name)

    def factory(n: int):
        model, ids, kw = scale_llama.build(name, *_size(dim, n), layers=layers)
        return model, (ids,), kw

    start = time.perf_counter()
    memory = device.usable(fsdp.nccl_communicators) if memory is None else memory
    fit = executor.fit(
        factory, memory, dim=dim, time_limit=time_limit,
        target=device, fsdp=fsdp, offload=offload,
        capture_options={"granularity": granularity},
    )  # fmt: skip
    unit = 1 if dim == "batch" else SEQ_UNIT
    schedule = fit.schedule
    return {
        "fit s": time.perf_counter() - start,
        "largest": None if fit.size is None else fit.size * unit,
        "proven": fit.proven,
        "upper": None if fit.upper is None else fit.upper * unit,
        "host peak": fit.host_peak,
        "status": None if schedule is None else schedule.status,
        "summary": fit.summary(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="results")
    parser.add_argument("--dims", nargs="+", default=["batch", "seq"])
    parser.add_argument("--policies", nargs="+", default=["sac", "remat"])
    parser.add_argument("--time-limit", type=float, default=120)
    parser.add_argument("--most", type=int, default=128, help="the largest size tried")
    parser.add_argument("--granularity", choices=("op", "module"), default="op")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "scale_fit.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    for dim in args.dims:
        row = results.setdefault(dim, {})
        start = time.perf_counter()
        if "sac" in args.policies:
            row["sac"] = sac_fits(dim, args.time_limit, args.most)
            row["sac"]["seconds"] = time.perf_counter() - start
        if "remat" in args.policies:
            try:
                row["remat"] = remat_fit(dim, 4 * args.time_limit, args.granularity)
            except Exception as e:  # the benchmark records what failed
                row["remat"] = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps({dim: row}, default=str), flush=True)
        saved.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
