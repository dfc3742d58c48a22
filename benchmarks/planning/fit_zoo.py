"""The largest sequence length (GPT-2, Llama) and batch (ResNet-18) that one memory holds:
remat (`executor.fit`) against eager (measured) and per-block checkpointing (predicted).

Each row is one `executor.fit` run on this machine's CPU, one torch thread: the size remat
proves and runs (its whole step measured within the memory under remat's executor), the
largest size whose eager step measures within the memory (with the size after it measured
over), and the largest size at which checkpointing every block of one module depth fits, as the
solver's simulator predicts it (`block_checkpoint`, the depth of least peak). AdamW state,
gradients, parameters and inputs are counted (`executor.fitting.memory`).

Run: nice -n 5 python -m benchmarks.planning.fit_zoo [--time-limit 60] [--compute-budget 1.3x]
     [--out results]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import executor
from benchmarks.common import Row, write_table
from benchmarks.zoo.bench import HFLoss, image_batch
from benchmarks.zoo.resnet import resnet18

POSITIONS = 2048
"""Position embeddings of the language models: fixed, so that parameters do not change with
the sequence length."""


def _ids(batch: int, seq: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    return ids, ids.clone()


def gpt2_seq(seq: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """GPT-2, 2 layers, width 128, batch 2, at sequence length `seq`; forward returns the
    loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=128,
        n_head=4,
        vocab_size=512,
        n_positions=POSITIONS,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = HFLoss(GPT2LMHeadModel(config).train(), ("input_ids", "labels"))
    return model, _ids(2, seq, 512)


def llama_seq(seq: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Llama, 2 layers, width 128, batch 2, at sequence length `seq`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=POSITIONS,
        use_cache=False,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = HFLoss(LlamaForCausalLM(config).train(), ("input_ids", "labels"))
    return model, _ids(2, seq, 512)


def resnet18_batch(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """ResNet-18 (width 16) on 32x32 images at batch `batch`."""
    model, _ = resnet18(batch=1, image=32, width=16)
    return model, image_batch(batch, 32, 10)


@dataclass(frozen=True)
class Case:
    label: str
    factory: Callable[[int], object]
    dim: str
    memory: str


CASES = (
    Case("GPT-2, 2 layers", gpt2_seq, "seq", "32MiB"),
    Case("Llama, 2 layers", llama_seq, "seq", "24MiB"),
    Case("ResNet-18 (width 16, 32x32)", resnet18_batch, "batch", "32MiB"),
)


def fit_row(case: Case, time_limit: float, compute_budget: str | None) -> Row:
    started = time.perf_counter()
    found = executor.fit(
        case.factory,
        case.memory,
        dim=case.dim,
        compute_budget=compute_budget,
        time_limit=time_limit,
        low=2,  # the language models' graphs differ at sequence length 1
    )
    print(found.summary(), flush=True)
    return {
        "model": case.label,
        "dim": case.dim,
        "memory": case.memory,
        "compute budget": compute_budget or "unlimited",
        "remat": found.size,
        "proven": "yes" if found.proven else f"open to {found.upper}",
        "remat measured peak (B)": found.measured_peak,
        "eager (measured)": found.eager_size,
        "eager +1 measured (B)": found.eager_over,
        "per-block (predicted)": found.per_block_size,
        "bytes": "affine" if "not affine" not in found.bytes_model else "captured per size",
        "s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per fit")
    parser.add_argument("--compute-budget", "--max-overhead", default="1.3x")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [fit_row(case, args.time_limit, args.compute_budget) for case in CASES]
    finally:
        torch.set_num_threads(before)
    path = write_table(rows, args.out, "fit_zoo", "Largest size at a fixed memory")
    print(path.read_text())


if __name__ == "__main__":
    main()
