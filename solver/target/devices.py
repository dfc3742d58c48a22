"""The device a plan is made for, as a model: what an op costs there and how its allocator rounds.

A `Device` holds peak arithmetic rates (FLOP/s per dtype), memory bandwidth (bytes/s), memory
(bytes: nvidia-smi's figure, the capacity the CUDA driver reports and what a process holds
outside PyTorch's allocator; `Device.usable` is what a plan may use), the allocator's rounding
(bytes), a fixed cost per op (seconds: dispatch and launch) and whose kernels its ops run
(``kernels``: ``"cpu"`` or ``"cuda"``, which selects the model of kernel workspaces,
`graph_capture.measurement.workspace`). An op's predicted seconds are its
roofline, the larger of its FLOPs over the peak rate of its dtype and the bytes it reads and
writes over the bandwidth, plus the fixed cost, unless a measured table (`Device.op_seconds`,
written by ``remat calibrate`` on the device itself) holds the op: then the measured seconds are
used. Likewise an op's workspace bytes come from `Device.op_transient` where it holds the op.

The built-in figures are the vendors' published dense peaks (no structured sparsity), upper bounds
that no kernel reaches, so predicted seconds are lower bounds unless calibrated. Their memory
(NOTE [ usable memory ]) is nvidia-smi's figure, the total capacity PyTorch's out-of-memory
messages report for that GPU, and an assumed figure for the memory a process holds outside
PyTorch's allocator. ``cpu`` is this processor and is measured, not listed: its
`Device` comes from ``graph_capture.measurement.roofline.cpu_device``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from solver.core.link import Link, LinkError
from solver.errors import RematError

FORMAT = "remat-device/2"
READABLE = ("remat-device/1", FORMAT)
"""Device file formats read: version 1 has no ``op_overhead``, ``kernels`` nor
``op_transient`` (read as 0, the name's kernels, and none); a file without ``capacity`` or
``outside`` reads them as None (``memory``) and 0."""
CUDA_BLOCK_BYTES = 512
TERA = 1e12
GIB = 1 << 30
MIB = 1 << 20
LAUNCH_SECONDS = 5e-6
"""Fixed seconds per op on a built-in GPU: a CUDA kernel launch, a round figure of the few
microseconds NVIDIA publishes for one (an assumption, not measured here)."""
KERNELS = ("cpu", "cuda")

# NOTE [ usable memory ]
# What a PyTorch process can allocate on a GPU is less than nvidia-smi's memory. The CUDA driver
# reports a smaller total (`torch.cuda.mem_get_info`, "GPU 0 has a total capacity of 79.25 GiB"
# in an out-of-memory message on an A100 80GB whose nvidia-smi shows 81,920 MiB), and the
# process holds part of that outside PyTorch's caching allocator: the CUDA context and the
# cuBLAS/cuDNN workspaces, and NCCL's buffers once it joins a process group. An OOM message
# states it: "this process has X in use. Of the allocated memory Y is allocated by PyTorch, and
# Z is reserved by PyTorch but unallocated": X - Y - Z is outside PyTorch. A plan may use
# `Device.usable` = capacity - outside (- `NCCL_COMMUNICATOR_BYTES` per NCCL communicator);
# the caching allocator's reserved-but-unallocated bytes (fragmentation) are not deducted: a
# plan's peak is bytes allocated. Sources for the built-in figures: docs/estimate.md, "Usable
# memory".
OUTSIDE_BYTES = GIB // 2
"""Assumed bytes a single CUDA process holds outside PyTorch's allocator (context, cuBLAS and
cuDNN workspaces): out-of-memory messages on A100, A800, L40, RTX 4090/5090 and RTX 6000 Ada
read 0.34-0.58 GiB, most near 0.5 GiB (docs/estimate.md, "Usable memory")."""
NCCL_COMMUNICATOR_BYTES = 688 * 1000**2
"""Assumed bytes an NCCL communicator holds outside PyTorch's allocator: 688 MB measured for a
group of more than 2 ranks on A100s with NVLink (544 MB for 2; NVIDIA/nccl issue 964)."""


class UnknownTargetError(RematError, ValueError):
    """A target that is neither a built-in device nor a readable device file."""


class DeviceError(RematError, ValueError):
    """A `Device` (built, or read from a device file) with a figure a plan cannot use: no
    float32 rate, a rate or rounding that is not positive, a negative op overhead, unknown
    kernels, or outside bytes not below the capacity."""


@dataclass(frozen=True)
class Device:
    """A device a plan is made for.

    - ``flops``: peak FLOP/s per dtype name (``"float32"``, ``"bfloat16"``, ...); a dtype not
      listed runs at the ``"float32"`` rate.
    - ``bandwidth``: memory bandwidth, bytes/s.
    - ``memory``: device memory, bytes, as nvidia-smi reports it.
    - ``capacity``: the total bytes the CUDA driver reports (`torch.cuda.mem_get_info`'s total,
      an out-of-memory message's "total capacity"); None: ``memory``.
    - ``outside``: bytes the process holds outside PyTorch's allocator (CUDA context, library
      workspaces), an assumed figure on the built-in GPUs (NOTE [ usable memory ]).
    - ``rounding``: the allocator rounds each block up to a multiple of this many bytes (512 for
      the CUDA caching allocator, 1 where blocks are as requested).
    - ``op_seconds``: measured seconds per op key (`op_key`), from ``remat calibrate``.
    - ``op_overhead``: fixed seconds every op pays beyond its roofline (dispatch, launch).
    - ``kernels``: ``"cpu"`` (aten's CPU kernels and oneDNN) or ``"cuda"``: the workspace model.
    - ``op_transient``: measured workspace bytes per op key, from ``remat calibrate``.
    - ``host_link``: the link to host memory that offloaded values copy over (bytes/s per
      direction; `HOST_LINKS`, docs/offload.md); None: unknown.
    """

    name: str
    flops: Mapping[str, float]
    bandwidth: float
    memory: int
    rounding: int = CUDA_BLOCK_BYTES
    op_seconds: Mapping[str, float] = field(default_factory=dict)
    op_overhead: float = 0.0
    kernels: str = "cuda"
    op_transient: Mapping[str, int] = field(default_factory=dict)
    capacity: int | None = None
    outside: int = 0
    host_link: Link | None = None

    def __post_init__(self) -> None:
        if "float32" not in self.flops:
            raise DeviceError(f"device {self.name!r}: flops needs a 'float32' rate")
        if min(self.flops.values()) <= 0 or self.bandwidth <= 0 or self.rounding < 1:
            raise DeviceError(f"device {self.name!r}: rates and rounding must be positive")
        if self.op_overhead < 0:
            raise DeviceError(f"device {self.name!r}: op_overhead must be at least 0 seconds")
        if self.kernels not in KERNELS:
            raise DeviceError(f"device {self.name!r}: kernels must be one of {KERNELS}")
        if self.outside < 0 or self.usable() <= 0:
            raise DeviceError(
                f"device {self.name!r}: outside ({self.outside} B) must be at least 0 and less "
                f"than the capacity ({self.total} B)"
            )

    @property
    def total(self) -> int:
        """The capacity the CUDA driver reports, bytes (``capacity``, else ``memory``)."""
        return self.memory if self.capacity is None else self.capacity

    def usable(self, nccl_communicators: int = 0) -> int:
        """Bytes a plan may allocate through PyTorch on this device: the capacity less the
        process's memory outside PyTorch's allocator and `NCCL_COMMUNICATOR_BYTES` per NCCL
        communicator it holds (1 for FSDP2 over one process group; NOTE [ usable memory ])."""
        return self.total - self.outside - nccl_communicators * NCCL_COMMUNICATOR_BYTES

    def describe_usable(self, nccl_communicators: int = 0) -> str:
        """What `usable` counts, in words with GiB, for messages and reports."""
        parts = [
            f"capacity {self.total / GIB:.2f} GiB",
            f"outside PyTorch {self.outside / GIB:.2f}",
        ]
        if nccl_communicators:
            nccl = nccl_communicators * NCCL_COMMUNICATOR_BYTES / GIB
            parts.append(f"NCCL {nccl:.2f}")
        return f"{self.usable(nccl_communicators) / GIB:.2f} GiB usable ({' less '.join(parts)})"

    def round_bytes(self, nbytes: int) -> int:
        """Bytes the allocator holds for a block of ``nbytes`` bytes (0 stays 0)."""
        return -(-nbytes // self.rounding) * self.rounding

    def roofline_seconds(self, flops: float, bytes_moved: float, dtype: str) -> float:
        """Seconds of an op doing ``flops`` FLOPs in ``dtype`` and moving ``bytes_moved`` bytes:
        the larger of compute and memory time, plus the fixed `op_overhead`."""
        rate = self.flops.get(dtype, self.flops["float32"])
        return max(flops / rate, bytes_moved / self.bandwidth) + self.op_overhead

    def view_seconds(self, key: str) -> float:
        """Predicted seconds of the view op ``key`` (it makes a new view of existing memory:
        no bytes move): measured if calibrated, else the fixed `op_overhead` on ``"cpu"``
        kernels (the dispatch the processor runs in line) and 0 on ``"cuda"`` (no kernel is
        launched; the host's dispatch overlaps the device's work)."""
        measured = self.op_seconds.get(key)
        if measured is not None:
            return measured
        return self.op_overhead if self.kernels == "cpu" else 0.0

    def seconds(self, key: str, flops: float, bytes_moved: float, dtype: str) -> float:
        """Predicted seconds of the op ``key``: measured if calibrated, else its roofline."""
        measured = self.op_seconds.get(key)
        if measured is not None:
            return measured
        return self.roofline_seconds(flops, bytes_moved, dtype)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "name": self.name,
            "flops": dict(self.flops),
            "bandwidth": self.bandwidth,
            "memory": self.memory,
            "rounding": self.rounding,
            "op_seconds": dict(self.op_seconds),
            "op_overhead": self.op_overhead,
            "kernels": self.kernels,
            "op_transient": dict(self.op_transient),
            "capacity": self.capacity,
            "outside": self.outside,
            "host_link": None if self.host_link is None else self.host_link.to_json(),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the device file that `Device.load` reads (JSON, `to_json`)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Device:
        """A device file written by ``remat calibrate`` or `Device.save`; `UnknownTargetError`
        where the file cannot be read or is not a device file."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UnknownTargetError(f"cannot read device file {os.fspath(path)!r}: {e}") from e
        return cls.from_json(data, source=repr(os.fspath(path)))

    @classmethod
    def from_json(cls, data: Mapping, source: str = "device file") -> Device:
        if data.get("format") not in READABLE:
            raise UnknownTargetError(
                f"{source} is not a remat device file (format {data.get('format')!r}, "
                f"expected one of {READABLE}); write one with `remat calibrate`"
            )
        name = str(data["name"])
        return cls(
            name=name,
            flops={str(k): float(v) for k, v in data["flops"].items()},
            bandwidth=float(data["bandwidth"]),
            memory=int(data["memory"]),
            rounding=int(data["rounding"]),
            op_seconds={str(k): float(v) for k, v in data.get("op_seconds", {}).items()},
            op_overhead=float(data.get("op_overhead", 0.0)),
            kernels=str(data.get("kernels", "cpu" if name == "cpu" else "cuda")),
            op_transient={str(k): int(v) for k, v in data.get("op_transient", {}).items()},
            capacity=None if data.get("capacity") is None else int(data["capacity"]),
            outside=int(data.get("outside", 0)),
            host_link=None if data.get("host_link") is None else Link.from_json(data["host_link"]),
        )


def op_key(op: str, shapes: list[tuple[int, ...]], dtypes: list[str]) -> str:
    """The key of an op in a measured table: its name and its tensor inputs' shapes and dtypes."""
    parts = [f"{dtype}{list(shape)}" for shape, dtype in zip(shapes, dtypes, strict=True)]
    return f"{op}({', '.join(parts)})"


GB = 1e9

COPY_LATENCY = 5e-6
"""Seconds every host copy takes besides its bytes over the bandwidth (`Link.d2h_latency`,
`Link.h2d_latency`): the lower end of the 5-7 microseconds per ``cudaMemcpyAsync`` call
measured for small copies in "DualPath: Breaking the Storage Bandwidth Bottleneck in Agentic
LLM Inference" (Wu et al., arXiv 2602.21548, 2026, section 5.2), a per-call cost of the CUDA
driver, so the same over PCIe and NVLink-C2C. The lower end, as the bandwidths are peaks: the
predicted stalls stay lower bounds. `remat calibrate --base` measures it."""
_PINNED = {
    "d2h_latency": COPY_LATENCY,
    "h2d_latency": COPY_LATENCY,
    "host_rounding": "power-of-two",
}
"""A GPU's host link's copies: `COPY_LATENCY` each way, into pinned host memory."""

HOST_LINKS: dict[str, Link] = {
    "pcie5": Link(64 * GB, 64 * GB, **_PINNED),
    "pcie4": Link(32 * GB, 32 * GB, **_PINNED),
    "c2c": Link(450 * GB, 450 * GB, **_PINNED),
}
"""Host links by name, each direction's published peak (bytes/s): PCIe Gen5 x16 and Gen4 x16
as NVIDIA's datasheets state them for the H100 SXM (128 GB/s) and the A100 (64 GB/s), both
directions together, and the NVLink-C2C of a GH200 Grace Hopper Superchip (900 GB/s, both
directions together), with `COPY_LATENCY` per copy each way; one copy engine per direction.
Upper bounds, like the other built-in figures: pinned host-to-device copies are commonly
reported near 80% of the PCIe figures (not measured here), so predicted stalls are lower
bounds. No GH200 device is built in (its usable memory is not known here): `c2c` is its link,
for `remat solve --offload c2c`. Each holds its copies in pinned host memory
(``host_rounding="power-of-two"``, as torch's pinned allocator rounds them)."""


def _gpu(
    name: str, peaks: tuple[float, float, float, float], tbs: float, mib: int, gib: float, link: str
) -> Device:
    """A built-in GPU from its published figures (`peaks`: dense TFLOP/s in FP32, TF32 tensor,
    BF16/FP16 tensor and FP64; the others as `BUILT_IN`'s comment says)."""
    fp32, tf32, bf16, fp64 = peaks
    flops = {
        "float32": fp32 * TERA,
        "tf32": tf32 * TERA,
        "bfloat16": bf16 * TERA,
        "float16": bf16 * TERA,
        "float64": fp64 * TERA,
    }
    return Device(
        name,
        flops,
        bandwidth=tbs * TERA,
        memory=mib * MIB,
        op_overhead=LAUNCH_SECONDS,
        capacity=round(gib * 1024) * MIB,
        outside=OUTSIDE_BYTES,
        host_link=HOST_LINKS[link],
    )


# Published dense peaks in TFLOP/s (FP32, TF32 tensor, BF16/FP16 tensor, FP64), bandwidth in
# TB/s, memory in MiB as nvidia-smi reports it, the total capacity in GiB as PyTorch's
# out-of-memory messages print it on that GPU (NOTE [ usable memory ]; sources and spread in
# docs/estimate.md, "Usable memory"), and the host link (`HOST_LINKS`: the H100s on PCIe Gen5
# x16, the others on Gen4 x16, as published). `h100-96gb`: the H100 with 96 GB of HBM2e that
# torchtitan's published runs used (docs/benchmarks.md, "torchtitan's published runs"); its
# rates and bandwidth are assumed equal to the H100 SXM's (not published here), its memory is
# the nominal 96 GiB, its capacity the one torchtitan's own logs imply (GiB over percent of
# capacity).
BUILT_IN: dict[str, Device] = {
    d.name: d
    for d in (
        _gpu("h100", (66.9, 494.7, 989.4, 66.9), 3.35, 81_559, 79.11, "pcie5"),
        _gpu("h100-96gb", (66.9, 494.7, 989.4, 66.9), 3.35, 96 * 1024, 95.02, "pcie5"),
        _gpu("a100-80gb", (19.5, 156.0, 312.0, 19.5), 2.039, 81_920, 79.25, "pcie4"),
        _gpu("a100-40gb", (19.5, 156.0, 312.0, 19.5), 1.555, 40_960, 39.39, "pcie4"),
        _gpu("l4", (30.3, 60.0, 121.0, 0.49), 0.300, 23_034, 22.03, "pcie4"),
        _gpu("rtx4090", (82.6, 82.6, 165.2, 1.29), 1.008, 24_564, 23.65, "pcie4"),
    )
}
ALIASES = {"h100-sxm": "h100", "h100-80gb": "h100", "a100": "a100-80gb", "4090": "rtx4090"}
TARGET_NAMES = (*BUILT_IN, "cpu")


def builtin_device(name: str) -> Device:
    """The built-in GPU called ``name`` (case-insensitive, aliases allowed).

    ``cpu`` is measured, not built in: torch-side callers get it from
    ``graph_capture.measurement.roofline.cpu_device``."""
    key = ALIASES.get(name.lower(), name.lower())
    if key in BUILT_IN:
        return BUILT_IN[key]
    raise UnknownTargetError(
        f"unknown target {name!r}: use one of {', '.join(TARGET_NAMES)}, "
        "or a device file written by `remat calibrate`"
    )


def named_link(name: str) -> Link:
    """The host link called ``name``: one of `HOST_LINKS` or a built-in target's
    (`builtin_device(name).host_link`), case-insensitive, or a device file's (a path: the link
    ``remat calibrate`` measured). `UnknownTargetError` where it names none of these,
    `solver.core.link.LinkError` for a target or file without a host link."""
    key = name.strip().lower()
    if key in HOST_LINKS:
        return HOST_LINKS[key]
    try:
        link = (
            Device.load(name).host_link if is_device_file(name) else builtin_device(key).host_link
        )
    except UnknownTargetError as error:
        raise UnknownTargetError(f"{error}; or a host link: {', '.join(HOST_LINKS)}") from None
    if link is None:
        raise LinkError(
            f"target {name!r} has no host link; give the link's bandwidths, or measure one "
            "with `remat calibrate`"
        )
    return link


def host_link(offload: Link | str) -> Link:
    """The link ``offload`` stands for: a `Link` as it is, a name as `named_link` reads it;
    `LinkError` for anything else."""
    if isinstance(offload, Link):
        return offload
    if not isinstance(offload, str):
        raise LinkError(
            f"offload must be a solver.Link or the name of a host link or target ('pcie5', "
            f"'h100'), not {offload!r}"
        )
    return named_link(offload)


def is_device_file(target: str) -> bool:
    """Whether ``target`` names a file rather than a built-in device."""
    return os.sep in target or target.endswith(".json") or Path(target).is_file()
