"""The one table of GPU names and aliases: tracegen's compute catalog and netmodels' interconnect presets
both key by these names, so one GPU name works for compute and interconnect alike (DESIGN.md, "Hardware
facts live once"). It lives in `traces` because both packages may import it and neither may import the
other."""

from __future__ import annotations

# The catalog's GPUs, in catalog order (tracegen/catalog.py holds their numbers, netmodels/presets.py their
# interconnect rows; tests/test_custom_gpus.py checks both cover exactly these names).
GPU_NAMES: tuple[str, ...] = (
    "A100-40GB", "A100-80GB", "H100", "H200", "B200", "V100", "GB200", "H20", "L40S", "MI300X",
)  # fmt: skip

# Other spellings users write (matched case-insensitively). "A100" is the paper's A100 40GB.
GPU_ALIASES: dict[str, str] = {
    "A100": "A100-40GB",
    "A100-40G": "A100-40GB",
    "A100-80G": "A100-80GB",
    "H100-80GB": "H100",
    "H100-SXM": "H100",
    "H200-141GB": "H200",
    "B200-192GB": "B200",
    "V100-32GB": "V100",
    "GB200-186GB": "GB200",
    "H20-96GB": "H20",
    "L40S-48GB": "L40S",
    "MI300X-192GB": "MI300X",
}


def catalog_name(name: object) -> str | None:
    """The catalog spelling of `name` (case-insensitive, aliases resolved), or None for other names."""
    key = str(name).strip().upper()
    for g in GPU_NAMES:
        if g.upper() == key:
            return g
    for alias, target in GPU_ALIASES.items():
        if alias.upper() == key:
            return target
    return None


# Kineto's deviceProperties[].name is the CUDA/ROCm device name (cudaGetDeviceProperties().name), e.g.
# "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB", "AMD Instinct MI300X". The
# patterns below (checked in order, case-insensitive, on the name without spaces) map it to a catalog GPU.
_DEVICE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("GB200", "GB200"),
    ("B200", "B200"),
    ("H200", "H200"),
    ("H100", "H100"),
    ("H20", "H20"),
    ("A100", "A100-80GB"),  # narrowed to 40GB below when the name says 40GB
    ("L40S", "L40S"),
    ("V100", "V100"),
    ("MI300X", "MI300X"),
)


def from_device_name(device: str) -> str | None:
    """The catalog GPU a recorded device name (Kineto deviceProperties) denotes, or None if none does."""
    key = device.upper().replace(" ", "")
    for pattern, name in _DEVICE_PATTERNS:
        if pattern in key:
            if name == "A100-80GB" and "80GB" not in key:
                return "A100-40GB"
            return name
    return None
