"""How long `remat estimate` takes, and in how much memory, on Llama-3-8B and -70B configs.

    python -m benchmarks.planning.estimate_speed [--only llama3_8b llama3_70b llama32_1b]
        [--time-limit 120] [--largest batch seq] [--alloc-conf CONF]

Each run writes the model's `config.json` (the published Llama-3 shapes of
`benchmarks.planning.scale_llama`) to a temporary folder and runs
`remat estimate --hf-config that/config.json --target T --world-size W --batch B --seq S` in a
child process, as a user would: its wall seconds (the whole command: Python's start, the meta
model's build, the fake step's recording, every strategy's rows and the solve) and its peak
RSS (`os.wait4`'s `ru_maxrss`) are measured here, its table printed below them. `--largest`
passes ``--largest`` on: each row's largest batch and sequence too, one estimate per size;
``--alloc-conf`` the allocator settings the one-process rows' reserved bytes are predicted under,
one run per setting given (``''`` for torch's defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.planning.scale_llama import GIB, LLAMA3, RUNS

L1B = {**LLAMA3, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32}
L1B |= {"intermediate_size": 8192, "tie_word_embeddings": True}
ESTIMATED = {**RUNS, "llama32_1b": (L1B, 1, 8192, "h100", 1, None)}
"""The runs this benchmark knows: `scale_llama.RUNS` and Llama-3.2-1B's shapes on one H100
(one process: the rows' reserved bytes are predicted there)."""

MAIN = ("llama3_8b", "llama3_70b")
"""The runs by default: `scale_llama.RUNS`' Llama-3-8B (H100, 8 ranks, sequence 8192) and -70B
(A100 80GB, 64 ranks, sequence 8192)."""


def config_file(folder: Path, name: str) -> Path:
    """Writes the run `name`'s Llama config as `folder/name/config.json`; returns its path."""
    config, *_ = ESTIMATED[name]
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
    parser.add_argument("--only", nargs="+", choices=sorted(ESTIMATED), default=list(MAIN))
    parser.add_argument("--time-limit", type=float, default=120)
    parser.add_argument("--largest", nargs="+", choices=("batch", "seq"), default=[])
    parser.add_argument(
        "--alloc-conf", nargs="+", help="passed on, one run each: the caching allocator's settings"
    )
    args = parser.parse_args(argv)
    rows, tables = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            _, batch, seq, target, world, _ = ESTIMATED[name]
            config = str(config_file(Path(tmp), name))
            for conf in args.alloc_conf or [None]:
                flags = [
                    "--hf-config", config, "--target", target, "--world-size", str(world),
                    "--batch", str(batch), "--seq", str(seq), "--time-limit", str(args.time_limit),
                ]  # fmt: skip
                flags += ["--largest", *args.largest] if args.largest else []
                flags += [] if conf is None else ["--alloc-conf", conf]
                seconds, rss, code, out = timed_estimate(flags)
                setting = "-" if conf is None else conf or "torch defaults"
                rows.append(
                    f"| {name} | {target} | {world} | {batch} x {seq} | {setting} | "
                    f"{seconds:.1f} | {rss / GIB:.2f} | {code} |"
                )
                tables.append(f"{name}: remat estimate {shlex.join(flags[2:])}\n\n{out}")
    print("| model | target | ranks | batch x seq | allocator | wall s | peak RSS GiB | exit |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("\n".join(tables))


if __name__ == "__main__":
    main()
