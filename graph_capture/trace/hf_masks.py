"""HF transformers' attention masks, traced as eager decides them.

Called eagerly with SDPA attention and no padding mask (``labels=`` only, or no
``attention_mask``), an HF decoder leaves the causal mask out: ``scaled_dot_product_attention``
runs with ``is_causal=True`` and, with fewer key/value heads than query heads,
``enable_gqa=True`` (`transformers.masking_utils._ignore_causal_mask_sdpa`,
`transformers.integrations.sdpa_attention.use_gqa_in_sdpa`). Under ``torch.export`` the same
code always builds the mask (an exported graph must stay valid for other inputs) and repeats
the key/value heads (``repeat_kv``), because ``enable_gqa`` is taken only without a mask. The
values agree, the bits do not: the CPU flash-attention backward sums the key/value gradients of
a head group inside the kernel with ``enable_gqa``, the repeated heads' gradients are summed by
the ``expand``'s backward in another order (a Llama with 4 query heads over 1 key/value head,
64 tokens: parameter gradients 1e-7 to 5e-7 apart, relative, in float32, 5e-3 to 8e-3 in
bfloat16).

A captured graph is specialised to its example anyway (shapes, and `executor.traced.checks`
refuses other ones), so the capture lets transformers decide as in eager: during the export,
its mask code does not see ``torch.compiler.is_exporting()``. What it then decides reads no
tensor data: a padding mask given as an input, or the ``position_ids`` it checks for packed
sequences without a cache (``use_cache=False``), are traced tensors (``is_tracing``), and the
mask is kept. Eager reads them and leaves the mask out where no token is padded and nothing is
packed: those calls, with grouped-query attention, still differ from eager in the last bits.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from torch import nn

__all__ = ["masks_as_eager"]


@contextlib.contextmanager
def masks_as_eager(model: nn.Module) -> Iterator[None]:
    """Within it, transformers' mask functions see no export (module docstring); a no-op for
    a model not from transformers, or a transformers without ``masking_utils``."""
    masking = sys.modules.get("transformers.masking_utils")
    if not type(model).__module__.startswith("transformers.") or masking is None:
        yield
        return
    exporting = getattr(masking, "is_torchdynamo_exporting", None)
    if exporting is None:
        yield
        return
    masking.is_torchdynamo_exporting = lambda: False
    try:
        yield
    finally:
        masking.is_torchdynamo_exporting = exporting
