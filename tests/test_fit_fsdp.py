"""`fit(..., target=, world_size=N)`: per rank under FSDP2, what exists before the step is the
FSDP model's resident bytes and the step's budget what it leaves of the memory; checked by hand
on a meta-built model, against the unsharded fit at a memory less exactly the FSDP bytes, and
the bad inputs refused in one line.

`MetaBlocks` (width 32, fp32, AdamW) on 2 ranks: each block's Linear shards 16 of 32 rows, a
padded shard of 16 x 32 + 16 = 528 elements (2,112 B); the head's (4, 32) weight and (4,) bias
2 x 32 + 2 = 66 elements (264 B). Unsharded, a block's group gathers 2 x 2,112 = 4,224 B, the
root's 528 B; the unsharded gradients are the parameters' 13,200 B."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import executor
from cli.main import main
from executor.errors import FitError
from executor.fitting.fsdp import fsdp_bytes
from solver.target import Device

pytestmark = pytest.mark.usefixtures("one_thread")

WIDTH = 32
TOY = Device("toy", {"float32": 1e12}, bandwidth=1e11, memory=1 << 30, rounding=1)
MEMORY = 100 * 1024
UNSHARDED = 4 * (3 * (WIDTH * WIDTH + WIDTH) + 4 * WIDTH + 4)  # 13,200 B of parameters


class MetaBlocks(nn.Module):
    """Three Linear+GELU blocks (the blocks FSDP shards) and a head (the root's)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(3)
        )
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().mean()


def meta_blocks(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    with torch.device("meta"):
        return MetaBlocks().train(), (torch.empty(batch, WIDTH),)


@pytest.fixture(scope="module")
def sharded() -> executor.Fit:
    return executor.fit(meta_blocks, MEMORY, target=TOY, world_size=2, time_limit=30)


def test_per_rank_bytes_are_the_fsdp_models_by_hand(sharded):
    fsdp = sharded.fsdp
    shards = 4 * (3 * 528 + 66)  # 6,600 B
    assert sharded.static.parameters == shards and sharded.static.gradients == 0
    assert sharded.static.optimizer_state == 2 * shards  # AdamW's moments of rank 0's rows
    assert sharded.optimizer_temporaries == shards
    assert fsdp.unsharded_grads == UNSHARDED and fsdp.memory.after == shards
    # block 1's pre-backward: the root unsharded (528), block 2's reduce-scatter input (4,224)
    # and sharded gradient (2,112), its unsharded gradients freed (-4,224), block 1's
    # all-gather output and unsharded parameters (2 x 4,224)
    moment = fsdp.moment
    assert (moment.window, moment.level) == ("backward 1", "start")
    assert moment.fsdp_bytes == 528 + 4224 + 2112 - 4224 + 2 * 4224 == 11088
    assert sharded.size is not None and sharded.proven
    budget = MEMORY - sharded.static.total - 11088 - UNSHARDED
    assert sharded.budget == budget and sharded.schedule.peak <= budget
    lines = sharded.summary()
    assert "resident 19800 B (sharded parameters 6600 B, optimizer state 13200 B" in lines
    assert "FSDP moment counted: backward 1, start, 11088 B" in lines


def test_agrees_with_the_unsharded_fit_at_the_memory_less_the_fsdp_bytes(sharded):
    fsdp = sharded.fsdp
    fsdp_bytes = fsdp.memory.resident + fsdp.moment.fsdp_bytes + fsdp.unsharded_grads
    unsharded_model = 4 * UNSHARDED  # parameters, gradients, AdamW's two moments
    one = executor.fit(
        meta_blocks, MEMORY - fsdp_bytes + unsharded_model, target=TOY, time_limit=30
    )
    assert one.fsdp is None and one.static.model == unsharded_model
    assert (one.size, one.proven, one.budget) == (sharded.size, sharded.proven, sharded.budget)


def test_no_memory_is_what_the_target_lets_pytorch_allocate():
    """memory=None with a target: its capacity less the process's memory outside PyTorch (no
    NCCL communicator over gloo), said in the notes."""
    gpu = Device("gpu", {"float32": 1e12}, 1e11, 1 << 30, 1, capacity=MEMORY + 512, outside=512)
    gloo = executor.fsdp_policy(2, gpu, backend="gloo")
    found = executor.fit(meta_blocks, None, target=gpu, fsdp=gloo, time_limit=30)
    assert found.memory == MEMORY == gpu.usable() and found.size is not None
    assert any("memory: gpu's 0.00 GiB usable (capacity" in n for n in found.notes)
    with pytest.raises(ValueError, match="of None stands for a target device's usable memory"):
        executor.fit(meta_blocks, None)


def test_bad_fsdp_input_is_refused():
    with pytest.raises(ValueError, match="world_size=2 needs estimate mode: pass target="):
        executor.fit(meta_blocks, MEMORY, world_size=2)
    with pytest.raises(FitError, match=r"world_size=2 and fsdp\.world_size=4 differ"):
        executor.fit(meta_blocks, MEMORY, target=TOY, world_size=2, fsdp=executor.FsdpPolicy(4))
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        executor.fit(meta_blocks, MEMORY, target=TOY, world_size=0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--world-size", "2"], "world_size=2 needs estimate mode: pass target= (--target)"),
        (
            ["--world-size", "2", "--target", "h100", "--param-dtype", "bfloat16"],
            "the FSDP policy gathers parameters in bfloat16, the model's are float32: the step "
            "is traced in the model's dtype, so build the model in bfloat16",
        ),
        (
            ["--target", "h100", "--param-dtype", "bfloat16"],
            "FSDP options (param_dtype) apply only with --world-size above 1",
        ),
    ],
)
def test_remat_fit_refuses_bad_fsdp_input_in_one_line(capsys, argv, message):
    argv = ["fit", "--model", "test_fit_fsdp:meta_blocks", "--memory", "1MiB", *argv]
    assert main([*argv, "--time-limit", "10"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bytes_that_do_not_grow_with_the_size_are_refused_not_searched_forever():
    """On h100 every block rounds to 512 B: the tiny model's bytes are the same at batch 2, 3
    and 4, so nothing bounds the batch (the doubling search once ran until torch overflowed)."""
    with pytest.raises(FitError, match="no byte of the step changes with the batch"):
        executor.fit(meta_blocks, "1MiB", target="h100", time_limit=30)


def test_the_block_order_of_a_meta_built_hf_llama_is_read_on_fake_tensors():
    """HF Llama's causal mask reads a value (`.item()`), which a meta tensor refuses: the order
    FSDP's groups run in comes from a forward on fake tensors (transformers skips that read for
    them), so a meta-built model's per-rank bytes are counted."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        use_cache=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).train()
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors"):
        model(ids, labels=ids)
    policy = executor.fsdp_policy(2, TOY)
    sharded = fsdp_bytes(model, (ids,), {"labels": ids}, policy)
    assert sharded.blocks == 3 and sharded.memory.resident > 0
