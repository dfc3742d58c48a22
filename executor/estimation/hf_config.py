"""A Hugging Face causal language model built from its `config.json` alone, on the meta
device (no weights, no hub), with a batch of token ids as its labels: what `remat estimate
--hf-config` estimates."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from executor.errors import PlanError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
"""The parameter dtypes a model may be built in, by name."""


def model_from_config(
    path: str | Path, batch: int, seq: int, dtype: str = "bfloat16"
) -> tuple[nn.Module, tuple[torch.Tensor], dict[str, torch.Tensor]]:
    """(the model of the `config.json` at `path` (the file, or a checkpoint folder holding
    it) built on the meta device in `dtype`, in training mode, its KV cache off; token ids of
    [batch, seq] on the meta device; {"labels": the ids}). PlanError for a missing file, a
    dtype not in `DTYPES` or a config transformers cannot build a causal LM from."""
    import transformers

    file = Path(path)
    file = file / "config.json" if file.is_dir() else file
    if not file.is_file():
        raise PlanError(f"no Hugging Face config at {file}: give a config.json or its folder")
    if dtype not in DTYPES:
        raise PlanError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    try:
        config = transformers.AutoConfig.from_pretrained(str(file))
        config.use_cache = False
        before = torch.get_default_dtype()
        torch.set_default_dtype(DTYPES[dtype])
        try:
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(config).train()
        finally:
            torch.set_default_dtype(before)
    except (ValueError, KeyError, OSError) as e:
        raise PlanError(f"cannot build a causal LM from {file}: {e}") from e
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return model, (ids,), {"labels": ids}
