"""A Hugging Face causal language model with its loss computed in chunks of the sequence
(`ChunkedLoss`): what `estimate` re-plans to see whether a chunked loss moves a limit set by
the loss's [tokens, vocab] logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
"""The label Hugging Face's loss leaves out."""
CHUNK = 1024
"""Tokens per chunk (per row of the batch)."""


def chunkable(model: nn.Module, kwargs: dict[str, object]) -> str:
    """Why `model` cannot take a chunked loss ("" where it can): a Hugging Face causal LM
    (a `base_model` and a linear output embedding) given `labels`."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if not isinstance(head, nn.Linear) or getattr(model, "base_model", model) is model:
        return "not a Hugging Face causal LM with a linear output head"
    if "labels" not in kwargs:
        return "the model is given no labels: its loss is outside it"
    return ""


class ChunkedLoss(nn.Module):
    """`model`'s training loss (the mean cross-entropy of each token's next, labels shifted
    as Hugging Face's causal LMs shift them, `IGNORE_INDEX` left out) computed `chunk` tokens
    at a time: each chunk's logits are made, reduced and freed in the forward and made again
    in the backward (`torch.utils.checkpoint`), so one chunk's [batch, chunk, vocab] logits
    live at once instead of the whole sequence's. The output head is applied as a plain
    linear layer (no logit soft-capping or scaling)."""

    def __init__(self, model: nn.Module, chunk: int = CHUNK) -> None:
        super().__init__()
        self.model = model
        self.chunk = chunk

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.model.base_model(input_ids=input_ids).last_hidden_state[:, :-1]
        targets = labels[:, 1:]
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[1], self.chunk):
            part = slice(start, start + self.chunk)
            total = total + checkpoint(
                self._summed, hidden[:, part], targets[:, part], use_reentrant=False
            )
        return total / (targets != IGNORE_INDEX).sum()

    def _summed(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.model.get_output_embeddings()(hidden).float()
        return F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
