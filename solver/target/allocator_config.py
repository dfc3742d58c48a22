"""The settings of PyTorch's CUDA caching allocator that `caching_allocator` follows
(`AllocatorConfig`: torch's defaults, or read from a ``PYTORCH_ALLOC_CONF`` string by torch's
syntax and checks), the allocator's constants (``c10/cuda/CUDACachingAllocator.cpp``; their
source lines in docs/allocator.md), and the two sizes the settings decide: the bytes a request
takes (``round_size``) and the bytes of a new segment (``get_allocation_size``). Torch-free;
bytes throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.errors import ArgumentError

MIB = 1 << 20
MIN_BLOCK_SIZE = 512
"""``kMinBlockSize``: every request is rounded up to a multiple of this (bytes)."""
SMALL_SIZE = MIB
"""``kSmallSize``: the largest rounded request of the small pool (bytes)."""
SMALL_BUFFER = 2 * MIB
"""``kSmallBuffer``: a small-pool segment, and a small-pool page of an expandable segment."""
MIN_LARGE_ALLOC = 10 * MIB
"""``kMinLargeAlloc``: large requests under this get a ``large_segment_size`` segment."""
ROUND_LARGE = 2 * MIB
"""``kRoundLarge``: larger requests get a segment of their size rounded up to this (bytes)."""
LARGE_BUFFER = 20 * MIB
"""``kLargeBuffer``: the default ``large_segment_size``, and a large-pool page of an expandable
segment (bytes)."""
ROUNDUP_INTERVALS = 16
"""``kRoundUpPowerOfTwoIntervals``: the power-of-two intervals from 1 MiB to 64 GiB that
``roundup_power2_divisions`` sets one by one."""
ADDRESS_SPACE = 1 << 46
"""Virtual bytes of one expandable segment in the model: more than any device maps."""

MODELLED_KEYS = (
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "large_segment_size_mb",
    "garbage_collection_threshold",
    "backend",
)
IGNORED_KEYS = (
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_free_catch_all",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
)
"""Keys torch knows that do not change what the device allocator reserves on one stream: host
pinned memory, locking, graph capture, and ``throw_on_cudamalloc_oom`` (it fails an allocation
before ``cudaMalloc`` where ``cudaMalloc`` would fail, which is where the model fails it)."""
REFUSED_KEYS = {
    "per_process_memory_fraction": "give simulate's capacity (bytes) as that fraction instead",
}


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings, torch's defaults unless given.

    ``max_split_size``, ``max_non_split_rounding_size`` and ``large_segment_size`` are bytes
    (``PYTORCH_ALLOC_CONF`` gives them in MiB); ``max_split_size`` None is torch's unlimited and
    ``max_non_split_rounding_size`` None is ``large_segment_size``. ``roundup_power2_divisions``
    is None (no power-of-two rounding), one number of divisions for every size, or 16 numbers,
    one per interval [2^i MiB, 2^(i+1) MiB) for i = 0..15 (the first also below 1 MiB, the last
    also above), each 0 or a power of two. ``garbage_collection_threshold`` is kept for the
    record: it acts only under a per-process memory fraction, which the model does not have.
    """

    expandable_segments: bool = False
    max_split_size: int | None = None
    max_non_split_rounding_size: int | None = None
    roundup_power2_divisions: int | tuple[int, ...] | None = None
    large_segment_size: int = LARGE_BUFFER
    garbage_collection_threshold: float | None = None

    def __post_init__(self) -> None:
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            divisions = (divisions,) * ROUNDUP_INTERVALS
            object.__setattr__(self, "roundup_power2_divisions", divisions)
        if divisions is not None and (
            len(divisions) != ROUNDUP_INTERVALS or any(d < 0 or d & (d - 1) for d in divisions)
        ):
            raise ArgumentError(
                f"roundup_power2_divisions {divisions!r}: give one number or "
                f"{ROUNDUP_INTERVALS}, each 0 or a power of two"
            )
        if self.large_segment_size <= MIN_LARGE_ALLOC:
            raise ArgumentError(
                f"large_segment_size {self.large_segment_size} bytes: torch requires more than "
                f"{MIN_LARGE_ALLOC // MIB} MiB"
            )
        for name in ("max_split_size", "max_non_split_rounding_size"):
            value = getattr(self, name)
            if value is not None and value < self.large_segment_size:
                raise ArgumentError(
                    f"{name} {value} bytes: torch requires at least large_segment_size "
                    f"({self.large_segment_size} bytes)"
                )
        threshold = self.garbage_collection_threshold
        if threshold is not None and not 0 < threshold < 1:
            raise ArgumentError(f"garbage_collection_threshold {threshold}: give one in (0, 1)")

    @classmethod
    def parse(cls, conf: str) -> AllocatorConfig:
        """The settings a ``PYTORCH_ALLOC_CONF`` (or ``PYTORCH_CUDA_ALLOC_CONF``) string makes,
        for example ``"expandable_segments:True,max_split_size_mb:512"``; torch's syntax and
        checks (``AcceleratorAllocatorConfig::parseArgs``). Raises `ArgumentError` on a key
        torch does not know, naming those it knows, and on one the model cannot follow."""
        entries = _entries(_tokens(conf))
        known = (*MODELLED_KEYS, *IGNORED_KEYS, *REFUSED_KEYS)
        fields: dict[str, object] = {}
        for key, value in entries:
            if key not in known:
                raise ArgumentError(
                    f"unknown allocator setting {key!r} in {conf!r}; torch knows "
                    + ", ".join(known)
                )
            if key in REFUSED_KEYS:
                raise ArgumentError(
                    f"allocator setting {key!r} is not modelled: {REFUSED_KEYS[key]}"
                )
            if key in MODELLED_KEYS:
                _read_setting(key, value, fields)
        return cls(**fields)

    @property
    def non_split_rounding(self) -> int:
        """Bytes by which a cached block may exceed a request of at least ``max_split_size``."""
        return self.max_non_split_rounding_size or self.large_segment_size

    def round_size(self, nbytes: int) -> int:
        """The bytes a request of ``nbytes`` takes (``round_size``)."""
        if nbytes < MIN_BLOCK_SIZE:
            return MIN_BLOCK_SIZE
        divisions = 0
        if self.roundup_power2_divisions is not None:
            interval = max(0, nbytes.bit_length() - 1 - 20)
            divisions = self.roundup_power2_divisions[min(interval, ROUNDUP_INTERVALS - 1)]
        if divisions > 1 and nbytes > MIN_BLOCK_SIZE * divisions:
            return _next_division(nbytes, divisions)
        return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE

    def allocation_size(self, size: int) -> int:
        """The bytes of a new segment for a rounded request of ``size``
        (``get_allocation_size``)."""
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return self.large_segment_size
        return -(-size // ROUND_LARGE) * ROUND_LARGE


def _next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` up to the next of ``divisions`` equal steps
    between the powers of two below and above it."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    below = size & ~(step - 1)
    return size if below == size else below + step


def _tokens(conf: str) -> list[str]:
    """``ConfigTokenizer``: names and values, with ``: , [ ]`` tokens of their own, no spaces."""
    tokens: list[str] = []
    word = ""
    for char in conf:
        if char in ",:[]":
            if word:
                tokens.append(word)
                word = ""
            tokens.append(char)
        elif not char.isspace():
            word += char
    return [*tokens, word] if word else tokens


Value = str | list[tuple[str, str]]
"""A setting's value: one token, or a bracketed list as (a, b) pairs of ``[a:b,...]``."""


def _entries(tokens: list[str]) -> list[tuple[str, Value]]:
    """(key, value) pairs of ``key:value,key:[a:b,c:d]``."""
    entries: list[tuple[str, Value]] = []
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise ArgumentError(f"allocator setting {key!r}: expected '{key}:<value>'")
        if tokens[i + 2] != "[":
            entries.append((key, tokens[i + 2]))
            i += 3
        else:
            pairs: list[tuple[str, str]] = []
            i += 3
            while i < len(tokens) and tokens[i] != "]":
                if tokens[i] == ",":
                    i += 1
                    continue
                if i + 2 >= len(tokens) or tokens[i + 1] != ":":
                    raise ArgumentError(f"allocator setting {key!r}: expected [size:value,...]")
                pairs.append((tokens[i], tokens[i + 2]))
                i += 3
            if i >= len(tokens):
                raise ArgumentError(f"allocator setting {key!r}: ']' missing")
            entries.append((key, pairs))
            i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise ArgumentError(f"allocator settings: expected ',' after {key!r}")
            i += 1
    return entries


def _read_setting(key: str, value: Value, fields: dict[str, object]) -> None:
    """Sets ``fields`` from one modelled ``key:value`` (sizes from MiB to bytes)."""
    if isinstance(value, list) and key != "roundup_power2_divisions":
        raise ArgumentError(f"allocator setting {key!r} takes one value, not a list")
    text = value if isinstance(value, str) else ""
    if key == "expandable_segments":
        if text not in ("True", "False"):
            raise ArgumentError(f"expandable_segments:{text}: give True or False")
        fields["expandable_segments"] = text == "True"
    elif key == "backend":
        if text != "native":
            raise ArgumentError(
                f"backend:{text} is not modelled: the model is the native caching allocator"
            )
    elif key == "garbage_collection_threshold":
        fields[key] = _number(key, text, float)
    elif key == "roundup_power2_divisions":
        fields[key] = _divisions(value)
    else:
        field = {
            "max_split_size_mb": "max_split_size",
            "max_non_split_rounding_mb": "max_non_split_rounding_size",
            "large_segment_size_mb": "large_segment_size",
        }[key]
        fields[field] = int(_number(key, text, int)) * MIB


def _number(key: str, text: str, kind: type[int] | type[float]) -> float:
    """``text`` read as ``kind``; `ArgumentError` naming the setting where it is not one."""
    try:
        return kind(text)
    except ValueError:
        raise ArgumentError(f"allocator setting {key}:{text}: give a number") from None


def _divisions(value: Value) -> int | tuple[int, ...]:
    """``parseRoundUpPower2Divisions``: one number, or ``[size_mb:divisions,...,>:divisions]``
    where the first entry also covers the intervals below it and ``>`` the ones above the last."""
    if isinstance(value, str):
        return int(_number("roundup_power2_divisions", value, int))
    table = [0] * ROUNDUP_INTERVALS
    first, last = True, 0
    for bound, text in value:
        divisions = int(_number("roundup_power2_divisions", text, int))
        if bound == ">":
            table[last + 1 :] = [divisions] * (ROUNDUP_INTERVALS - last - 1)
            continue
        size = int(_number("roundup_power2_divisions", bound, int))
        if size <= 0 or size & (size - 1):
            raise ArgumentError(f"roundup_power2_divisions: interval {bound} is not a power of 2")
        index = min(size.bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:
            table[:index] = [divisions] * index
            first = False
        table[index] = divisions
        last = index
    return tuple(table)
