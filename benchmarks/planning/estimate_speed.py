"""How long `remat estimate` takes, and in how much memory, on Llama-3-8B and -70B configs.

    python -m benchmarks.planning.estimate_speed [--only llama3_8b llama3_70b] [--time-limit 120]
        [--largest batch seq]

Each run writes the model's `config.json` (the published Llama-3 shapes of
`benchmarks.planning.scale_llama`) to a temporary folder and runs
`remat estimate --hf-config that/config.json --target T --world-size W --batch B --seq S` in a
child process, as a user would: its wall seconds (the whole command: Python's start, the meta
model's build, the fake step's recording, every strategy's rows and the solve) and its peak
RSS (`os.wait4`'s `ru_maxrss`) are measured here, its table printed below them. `--largest`
passes ``--largest`` on: each row's largest batch and sequence too, one estimate per size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.planning.scale_llama import GIB, RUNS

MAIN = ("llama3_8b", "llama3_70b")
"""The runs by default: `scale_llama.RUNS`' Llama-3-8B (H100, 8 ranks, sequence 8192) and -70B
(A100 80GB, 64 ranks, sequence 8192)."""


def config_file(folder: Path, name: str) -> Path:
    """Writes the run `name`'s Llama config as `folder/name/config.json`; returns its path."""
    config, *_ = RUNS[name]
    path = folder / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"model_type": "llama", **config}))
    return path


def timed_estimate(args: Sequence[str]) -> tuple[float, int, int, str]:
    """Run `remat estimate ARGS` in a child process: (wall seconds, peak RSS bytes, exit
    status, what it printed)."""
    command = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]
    start = time.perf_counter()
    child = subprocess.Popen(
        [*command, "estimate", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    return seconds, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status), out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), default=list(MAIN))
    parser.add_argument("--time-limit", type=float, default=120)
    parser.add_argument("--largest", nargs="+", choices=("batch", "seq"), default=[])
    args = parser.parse_args(argv)
    rows, tables = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            _, batch, seq, target, world, _ = RUNS[name]
            flags = [
                "--hf-config", str(config_file(Path(tmp), name)), "--target", target,
                "--world-size", str(world), "--batch", str(batch), "--seq", str(seq),
                "--time-limit", str(args.time_limit),
            ]  # fmt: skip
            flags += ["--largest", *args.largest] if args.largest else []
            seconds, rss, code, out = timed_estimate(flags)
            rows.append(
                f"| {name} | {target} | {world} | {batch} x {seq} | {seconds:.1f} | "
                f"{rss / GIB:.2f} | {code} |"
            )
            tables.append(f"{name}: remat estimate {' '.join(flags[2:])}\n\n{out}")
    print("| model | target | ranks | batch x seq | wall s | peak RSS GiB | exit |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("\n".join(tables))


if __name__ == "__main__":
    main()
