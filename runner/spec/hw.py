"""Hardware profiles: the numbers the judge and the agents use.

A profile lives in `hw_profiles/NAME.yaml` (validated against
schema.HW_PROFILE) with `NAME.md` beside it as context for agents. The judge
takes its ceilings from here (measured bandwidth, peak rates per dtype) to
compute the physical floor of a kernel's time; `check_device` compares a
CUDA profile with the GPU actually present and reports every mismatch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import yamlsrc
from ..core.errors import PipeError, SpecError
from .schema import HW_PROFILE, diagnostics

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class HwProfile:
    name: str
    kind: str  # "cpu" | "cuda"
    path: str
    data: dict = field(repr=False, compare=False)
    context: str = field(default="", repr=False, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def bandwidth(self) -> float:
        return float(self.data["bandwidth"]["measured_bytes_per_s"])

    @property
    def read_bandwidth(self) -> float | None:
        """The read-only bandwidth (bytes read a second by a kernel that writes next to nothing),
        where the profile gives it: above the copy figure on HBM, whose writes cost turnarounds."""
        v = self.data["bandwidth"].get("read_bytes_per_s")
        return float(v) if v else None

    def bandwidth_for(self, traffic: str = "copy") -> float:
        """The ceiling of an op's bytes: the read-only bandwidth for op.traffic 'read', else the
        copy bandwidth."""
        return (self.read_bandwidth or self.bandwidth) if traffic == "read" else self.bandwidth

    @property
    def bandwidth_measured(self) -> bool:
        """Whether the bandwidth is a measurement of the machine. `measured_by` says when it
        is not: an upper bound (host-cpu's, for the "faster than physics" check) or an
        estimate from the datasheet; a roofline drawn against such a figure means nothing."""
        by = str(self.data["bandwidth"].get("measured_by", ""))
        return not re.search(r"\b(not (yet )?measured|unmeasured|upper bound|estimate)", by, re.I)

    @property
    def bandwidth_source(self) -> str:
        return str(self.data["bandwidth"].get("measured_by", "")) or "not said"

    def peak_flops(self, dtype: str) -> float | None:
        v = self.data["peak_flops"].get(dtype)
        return float(v) if v else None

    @property
    def arch(self) -> str | None:
        return self.data.get("arch")

    @property
    def limit_slack(self) -> float:
        """How far under the measured floor a time may fall before it is called impossible."""
        return float(self.data.get("limit_slack", 0.05))


def _profile_dirs(near: Path) -> list[Path]:
    """The hw_profiles folders looked in, in order: `near`'s, every folder's above it, pipe's own."""
    return [d / "hw_profiles" for d in [near, *near.parents, PACKAGE_ROOT]]


def find_profile(name: str, near: Path) -> Path | None:
    """hw_profiles/NAME.yaml in the spec's folder or any folder above it, then pipe's own."""
    for d in _profile_dirs(near):
        p = d / f"{name}.yaml"
        if p.is_file():
            return p
    return None


def load_profile(path: Path) -> HwProfile:
    loc = yamlsrc.load_file(str(path))
    errs = diagnostics(loc, HW_PROFILE)
    if errs:
        raise SpecError(errs)
    md = path.with_suffix(".md")
    context = md.read_text(encoding="utf-8") if md.is_file() else ""
    return HwProfile(name=loc.data["name"], kind=loc.data["kind"], path=str(path),
                     data=loc.data, context=context)


class DeviceMismatch(PipeError):
    pass


def check_device(profile: HwProfile, props: Any) -> list[str]:
    """Mismatches between a CUDA profile and device properties (torch's or alike)."""
    out = []
    name = profile.get("device_name")
    if name and name.lower() not in str(props.name).lower():
        out.append(f"device is '{props.name}', profile '{profile.name}' expects '{name}'")
    sms = profile.get("sm_count")
    if sms and int(props.multi_processor_count) != sms:
        out.append(f"device has {props.multi_processor_count} SMs, profile says {sms}")
    arch = profile.arch
    if arch:
        cc = f"sm_{props.major}{props.minor}"
        if not arch.startswith(cc):
            out.append(f"device is {cc}, profile targets {arch}")
    mem = profile.get("memory_bytes")
    if mem and abs(int(props.total_memory) - mem) > 0.1 * mem:
        out.append(f"device has {props.total_memory / 2**30:.0f} GiB, profile says {mem / 2**30:.0f} GiB")
    return out


def check_present_device(profile: HwProfile, match: bool = True) -> None:
    """Raise DeviceMismatch if a CUDA profile finds no GPU here, or (`match`) one that does not
    match it. --no-hw-check passes `match=False`: it skips the profile's match, not the GPU."""
    if profile.kind != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise DeviceMismatch(f"profile '{profile.name}' needs a CUDA GPU and none is available"
                             + ("" if match else " (--no-hw-check skips the match with the profile, not the GPU)"))
    if not match:
        return
    props = torch.cuda.get_device_properties(0)
    bad = check_device(profile, props)
    if bad:
        raise DeviceMismatch(mismatch_text(profile, bad, matching_profiles(props, Path(profile.path).parent.parent)))


def matching_profiles(props: Any, near: Path) -> list[Path]:
    """The CUDA profiles that name a device and match `props` (check_device), from the
    hw_profiles folders find_profile searches (`near` and the folders above it, then pipe's
    own), the first of each name."""
    out: dict[str, Path] = {}
    for folder in _profile_dirs(near):
        for p in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            if p.stem in out:
                continue
            try:
                prof = load_profile(p)
            except (SpecError, OSError):
                continue
            if prof.kind == "cuda" and prof.get("device_name") and not check_device(prof, props):
                out[p.stem] = p
    return list(out.values())


def mismatch_text(profile: HwProfile, bad: list[str], matching: list[Path]) -> str:
    """What a run refused for a GPU its profile does not describe is told: every mismatch, and
    the profiles that do describe this GPU."""
    text = f"hardware profile {profile.path} does not match this GPU: " + "; ".join(bad)
    if matching:
        names = " or ".join(f"'{p.stem}' ({p})" for p in matching)
        return (text + f". This GPU matches the profile {names}: name it in the spec's `hardware` to judge "
                "against its figures, or pass --no-hw-check to run against this profile's")
    return text + " (pass --no-hw-check to run anyway)"

