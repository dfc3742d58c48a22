"""Regenerate every benchmark table and plot: python -m benchmarks [--quick] [--out results].

Full: seed claims, published Checkmate graphs, and the frontier + measured comparison of every
model (demo GPT/ResNet/U-Net, uniform stacks, HF GPT-2/BERT/ViT). --quick (the CI smoke test):
smaller stacks, two published graphs, the GPT demo only, short solver time limits. Writes
summary.md (every table) into the results folder, and the run's wall time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.common import Settings, write_table
from benchmarks.solving import frontier, published, seeds

FULL_MODELS = ("gpt", "resnet", "unet", "stack16", "stack48", "stack64", "gpt2", "bert", "vit")
QUICK_MODELS = ("gpt",)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--models", nargs="*", help="subset of models (default: all)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    settings = Settings(
        args.out,
        quick=args.quick,
        time_limit=3 if args.quick else 10,
        repeats=3 if args.quick else 7,
    )
    seeds.run(settings)
    published.run(settings)
    measured = []
    for name in args.models or (QUICK_MODELS if args.quick else FULL_MODELS):
        measured += frontier.run_model(name, settings)[1]
    write_table(measured, settings.out, "measured_all", "Measured: remat vs torch options")
    seconds = time.perf_counter() - start
    tables = sorted(settings.out.glob("*.md"))
    text = "\n\n".join(t.read_text() for t in tables if t.name != "summary.md")
    (settings.out / "summary.md").write_text(f"Total wall time {seconds:.0f} s\n\n{text}")
    print(f"benchmarks: {seconds:.0f} s, results in {settings.out}")


if __name__ == "__main__":
    main()
