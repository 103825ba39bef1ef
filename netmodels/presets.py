"""Interconnect parameters per GPU type: the paper's Table 5 (real testbed) and Table 6 (simulation-only).

Bandwidths are per link and per direction in bytes/s; delays in ns. The paper gives Gb/s (bits), so every
value below is converted with / 8. "PCIe delay 2x287.5 ns" is a GPU->NIC traversal that crosses the PCIe
switch twice; xsim puts the whole 2x value on the GPU<->NIC link (and half of it on each link of a PCIe
scale-up switch, so GPU->switch->GPU also costs 2x).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from xsim.netmodels.errors import TopologyError
from xsim.traces.gpu_names import catalog_name

GBIT = 1e9 / 8  # bytes/s in one Gb/s


@dataclass(frozen=True)
class InterconnectPreset:
    """Scale-up, PCIe and NIC parameters of one GPU type (bytes/s, ns)."""

    gpu: str
    scale_up_bandwidth: float
    scale_up_latency_ns: float
    pcie_bandwidth: float
    pcie_latency_ns: float  # the full GPU->NIC PCIe traversal (the paper's "2 x d")
    nic_bandwidth: float
    nic_latency_ns: float
    source: str


# A link as the paper's tables give it: (Gb/s per direction, delay in ns).
_Link = tuple[float, float]


def _p(gpu: str, scale_up: _Link, pcie: _Link, nic: _Link, source: str) -> InterconnectPreset:
    """A preset from a table row in the paper's units (pcie: the delay of one PCIe crossing, "d" of 2 x d)."""
    return InterconnectPreset(
        gpu, scale_up[0] * GBIT, scale_up[1], pcie[0] * GBIT, 2 * pcie[1], nic[0] * GBIT, nic[1], source
    )


_T5 = "xsim paper Table 5 (real-world cluster interconnect)"
_T6 = "xsim paper Table 6 (simulation-only cluster)"
# A100-80GB is not in the paper's tables; its NVLink (Gen3, 600 GB/s total) and PCIe Gen4 match the 40GB
# part per the NVIDIA A100 datasheet, so it reuses the A100 40GB row.
_A100_NOTE = "; A100-80GB reuses the A100 40GB row (same NVLink Gen3 / PCIe Gen4, NVIDIA A100 datasheet)"
# H200/B200 are absent from Table 6: their scale-up and PCIe rows come from Table 5 and the NIC from
# Table 6's ConnectX-7 row (400 Gb/s, 368 ns).
_T6_NOTE = "; H200/B200 absent from Table 6: scale-up/PCIe from Table 5, NIC from Table 6's ConnectX-7 row"
# Datasheet GPUs absent from both tables (issue 26): scale-up bandwidth from the vendor datasheet, delays from
# the Table 5 row of the same NVLink generation (or H100's where there is none), NIC: Table 6's ConnectX-7
# row (400 Gb/s, 368 ns) in both presets.
# GB200: NVLink 5 at 1.8 TB/s per GPU = 900 GB/s per direction (GB200 NVL72 datasheet: 130 TB/s over 72
# GPUs), B200's row otherwise. H20: NVLink 4 at 900 GB/s total = 450 per direction (NVIDIA H20 product
# brief), H100's row otherwise. L40S: no NVLink; GPUs meet over PCIe Gen4 x16, 64 GB/s bidirectional = 256
# Gb/s per direction (L40S datasheet), with the A100 row's PCIe Gen4 delays. MI300X: 7 Infinity Fabric links
# of 128 GB/s bidirectional (AMD Instinct MI300X datasheet) = 448 GB/s per direction in all, modelled as one
# switch like NVLink (a transfer between two GPUs of the real full mesh gets one 64 GB/s link: optimistic
# for point-to-point), H100's delays (no published figure), PCIe Gen5 as H100.
_DS = "vendor datasheet (see netmodels/presets.py)"
_DATASHEET_ROWS = {
    "GB200": ("GB200", (7200, 10.22), (512, 143.75), (400, 368), _DS),
    "H20": ("H20", (3600, 20.44), (512, 143.75), (400, 368), _DS),
    "L40S": ("L40S", (256, 287.5), (256, 287.5), (400, 368), _DS),
    "MI300X": ("MI300X", (3584, 20.44), (512, 143.75), (400, 368), _DS),
}

PRESETS: dict[str, dict[str, InterconnectPreset]] = {
    "table5": {
        "A100-40GB": _p("A100-40GB", (2400, 30.66), (256, 287.5), (10, 3000), _T5),
        "A100-80GB": _p("A100-80GB", (2400, 30.66), (256, 287.5), (10, 3000), _T5 + _A100_NOTE),
        "H100": _p("H100", (3600, 20.44), (512, 143.75), (10, 1500), _T5),
        "H200": _p("H200", (3600, 20.44), (512, 143.75), (200, 368), _T5),
        "B200": _p("B200", (7200, 10.22), (512, 143.75), (200, 368), _T5),
        **{g: _p(*row) for g, row in _DATASHEET_ROWS.items()},
    },
    "table6": {
        "A100-40GB": _p("A100-40GB", (2400, 30.66), (256, 287.5), (400, 368), _T6),
        "A100-80GB": _p("A100-80GB", (2400, 30.66), (256, 287.5), (400, 368), _T6 + _A100_NOTE),
        "H100": _p("H100", (3600, 20.44), (512, 143.75), (400, 368), _T6),
        "H200": _p("H200", (3600, 20.44), (512, 143.75), (400, 368), _T6 + _T6_NOTE),
        "B200": _p("B200", (7200, 10.22), (512, 143.75), (400, 368), _T6 + _T6_NOTE),
        **{g: _p(*row) for g, row in _DATASHEET_ROWS.items()},
    },
}

# The names and aliases are the compute catalog's: one table, traces/gpu_names.py.
GPU_NAMES: tuple[str, ...] = tuple(PRESETS["table5"])
# In the compute catalog, but neither of the paper's Tables 5 and 6 gives their interconnect.
NO_INTERCONNECT: tuple[str, ...] = ("V100",)


def canonical_gpu(name: str) -> str:
    """The project's GPU name for name ("A100" is the paper's A100 40GB), as the compute catalog spells it."""
    g = catalog_name(name)
    if g in NO_INTERCONNECT:
        raise TopologyError(
            f"GPU {name!r} is in the compute catalog, but the paper's Tables 5 and 6 give no interconnect for "
            "it: describe its network with --topology switch:N:BW:LAT (or a cluster's links)"
        )
    if g is None:
        raise TopologyError(
            f"unknown GPU {name!r} (known: {', '.join(GPU_NAMES)}, alias A100); a hypothetical GPU is described "
            "in a deployment spec's gpus: or a --gpu-file (docs/tracegen.md, 'Hypothetical GPUs')"
        )
    return g


def interconnect(preset: str, gpu: str, gpu_types: Mapping[str, Any] | None = None) -> InterconnectPreset:
    """The interconnect parameters of gpu under the named preset ("table5" or "table6"); a GPU named in
    `gpu_types` (a cluster description's user-defined GPUs) is that entry (defined_interconnect)."""
    table = PRESETS.get(preset)
    if table is None:
        raise TopologyError(f"unknown interconnect preset {preset!r} (known: {', '.join(PRESETS)})")
    if gpu_types and str(gpu) in gpu_types:
        return defined_interconnect(preset, str(gpu), gpu_types[str(gpu)])
    return table[canonical_gpu(gpu)]


# Keys of a cluster description's "gpu_types" entry (a user-defined GPU; tracegen.spec.derive_cluster writes
# them from the spec's `gpus:` definitions): bandwidths in bytes/s per direction.
GPU_TYPE_KEYS = ("like", "scale_up_bandwidth", "nic_bandwidth")


def defined_interconnect(preset: str, name: str, entry: Any) -> InterconnectPreset:
    """The interconnect of a user-defined GPU: the `like` GPU's row with the given bandwidths."""
    if not isinstance(entry, Mapping) or "like" not in entry or set(entry) - set(GPU_TYPE_KEYS):
        raise TopologyError(
            f'cluster "gpu_types" entry {name!r} must be a mapping of {", ".join(GPU_TYPE_KEYS)}'
        )
    row = PRESETS[preset][canonical_gpu(str(entry["like"]))]
    out = replace(row, gpu=name, source=f"user-defined GPU, delays and unset rates from {row.gpu}'s row")
    for k in ("scale_up_bandwidth", "nic_bandwidth"):
        v = entry.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not 1e9 <= v < float("inf"):
            raise TopologyError(f'cluster "gpu_types" {name}: {k} must be a rate >= 1e9 bytes/s, got {v!r}')
        out = replace(out, **{k: float(v)})
    return out


# ---------------------------------------------------------------------------------------------------------
# Whole-system presets (`cluster: dgx-a100`, `--topology dgx-h100:4`): NVIDIA DGX nodes of 8 GPUs (a GB200
# NVL72 rack: 72) on one NVSwitch fabric, one NIC per GPU, all NICs on a non-blocking fabric (modelled as one switch: the ideal of
# a full-bisection fat-tree). Hardware only: line rates per direction and the NICs by name. What NCCL gets
# out of them (its protocols' efficiency, channels, algorithm choice) is netmodels/nccl.py's model, applied
# to every cluster described with `collectives: nccl`, which these presets are.


@dataclass(frozen=True)
class SystemPreset:
    """One DGX-class system: GPUs per node, line rates (bytes/s, per direction), its NICs, delays."""

    name: str
    gpus: tuple[str, ...]  # GPU types the system holds (first = default)
    gpus_per_node: int
    nvlink_bandwidth: float  # line rate per GPU per direction
    nic: str  # the compute NICs by name (one per GPU)
    nic_bandwidth: float  # line rate of each of the node's NICs
    interconnect_row: str  # GPU row of Table 5 for PCIe and NVLink delays (the tables' values)
    nic_latency_ns: float
    source: str


GBYTE = 1e9
SYSTEM_PRESETS: dict[str, SystemPreset] = {
    # DGX A100: 8 A100 SXM4 on NVLink3 through 6 NVSwitches, 600 GB/s total per GPU = 300 GB/s per
    # direction (NVIDIA A100 datasheet); 8 single-port ConnectX-6 HDR InfiniBand 200 Gb/s NICs for compute
    # (NVIDIA DGX A100 datasheet / user guide).
    "dgx-a100": SystemPreset(
        "dgx-a100",
        ("A100-80GB", "A100-40GB"),
        8,
        300 * GBYTE,
        "ConnectX-6 HDR InfiniBand",
        200 * GBIT,
        "A100-40GB",
        368.0,
        "NVIDIA A100 and DGX A100 datasheets",
    ),
    # DGX A800: the DGX A100 with A800 SXM4 80GB GPUs, the export variant of the A100 with the same GA100
    # compute and HBM2e and NVLink cut from 600 to 400 GB/s total = 200 GB/s per direction (NVIDIA's
    # statement to Reuters and the A800 specification of the distributor Omnisky, November 2022, as
    # reported by heise online, "A800 fuer China: Nvidia umgeht US-Exportbeschraenkungen mit gebremstem
    # Nvlink", 2022-11-08). Its GPUs are the catalog's A100-80GB (the compute is the A100's); the NICs as
    # the DGX A100's (BAAI FlagPerf's DGX A800 nodes: InfiniBand 200 Gb/s).
    "dgx-a800": SystemPreset(
        "dgx-a800",
        ("A100-80GB",),
        8,
        200 * GBYTE,
        "ConnectX-6 HDR InfiniBand",
        200 * GBIT,
        "A100-40GB",
        368.0,
        "DGX A100 datasheet with the A800's 400 GB/s NVLink (Reuters / heise online, 2022-11)",
    ),
    # DGX H100: 8 H100 SXM5 on NVLink4, 900 GB/s total = 450 GB/s per direction (H100 datasheet); 8
    # single-port ConnectX-7 NDR 400 Gb/s NICs (DGX H100 datasheet). DGX H200 has the same fabric.
    "dgx-h100": SystemPreset(
        "dgx-h100",
        ("H100", "H200"),
        8,
        450 * GBYTE,
        "ConnectX-7 NDR InfiniBand",
        400 * GBIT,
        "H100",
        368.0,
        "NVIDIA H100 and DGX H100 datasheets",
    ),
    # DGX B200: 8 B200 on NVLink 5 through 2 NVSwitch chips, 1.8 TB/s total per GPU = 900 GB/s per direction
    # (18 links of 50 GB/s; NVIDIA DGX B200 datasheet: "1.8TB/s" NVLink per GPU, 14.4 TB/s aggregate); "4x
    # OSFP ports serving 8x single-port NVIDIA ConnectX-7 VPI, up to 400Gb/s InfiniBand/Ethernet" for compute
    # (NVIDIA DGX BasePOD reference architecture, "Core Components", DGX B200 system).
    "dgx-b200": SystemPreset(
        "dgx-b200",
        ("B200",),
        8,
        900 * GBYTE,
        "ConnectX-7 NDR InfiniBand",
        400 * GBIT,
        "B200",
        368.0,
        "NVIDIA DGX B200 datasheet; DGX BasePOD reference architecture (DGX B200 system)",
    ),
    # GB200 NVL72 (DGX GB200): one rack is one NVLink domain of 72 GPUs, NVLink 5 at 1.8 TB/s per GPU = 900
    # GB/s per direction through 9 NVLink switch trays (NVIDIA GB200 NVL72 datasheet: 130 TB/s over 72 GPUs;
    # DGX GB200 user guide, "Networking": "1.8 TB/s bidirectional per GPU with NVLink 5.0"). A "node" here is
    # that NVLink domain (NCCL's multi-node NVLink treats the rack as one NVLink clique); 18 compute trays of
    # 2 Grace CPUs and 4 GPUs each, every tray with "4x NVIDIA ConnectX-7 single port 400G OSFP NIC" for the
    # cluster network, one per GPU (DGX GB200 user guide, "Hardware", compute tray table). The Grace host
    # (4 GPUs per tray) matters only to the host CPU model (host_dispatch's host_launch_us: docs/compute.md).
    "gb200-nvl72": SystemPreset(
        "gb200-nvl72",
        ("GB200",),
        72,
        900 * GBYTE,
        "ConnectX-7 NDR InfiniBand",
        400 * GBIT,
        "GB200",
        368.0,
        "NVIDIA GB200 NVL72 datasheet; DGX GB200 user guide (hardware, networking)",
    ),
}
# NIC delay: the paper's Table 6 ConnectX-7 row (368 ns); no published ConnectX-6 figure is recorded, so
# dgx-a100 uses the same. NVLink and PCIe delays and PCIe rates: the Table 5 rows of the GPU.


def system_preset(name: str) -> SystemPreset:
    """The DGX-class system preset called `name` (case-insensitive)."""
    p = SYSTEM_PRESETS.get(str(name).strip().lower())
    if p is None:
        raise TopologyError(f"unknown cluster preset {name!r} (known: {', '.join(SYSTEM_PRESETS)})")
    return p
