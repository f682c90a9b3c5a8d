"""Device identity: which GPU (or CPU) a measurement ran on, and its baseline slug.

The slug names the baseline file (``baselines/<slug>.yaml``), so it must be stable across
driver updates, short, lowercase and filename-safe. Rules (see :func:`slugify`):

* GPU: the model name as CUDA/NVML reports it, lowercased, trademarks ``(R)``/``(TM)``
  dropped, every run of other characters turned into one ``-``; ``N`` identical visible GPUs
  get an ``Nx-`` prefix: ``NVIDIA H200`` -> ``nvidia-h200``, two of them ->
  ``2x-nvidia-h200``.
* CPU: ``cpu-`` + the model name without marketing noise (``(R)``, ``(TM)``,
  ``CPU @ 2.20GHz``, ``N-Core Processor``, ``Processor``, ``with Radeon Graphics``) +
  ``-<cores>c``, cores being those this process may run on: ``AMD EPYC 7B13 64-Core
  Processor`` on 2 cores -> ``cpu-amd-epyc-7b13-2c``.
* At most 80 characters (the model part is cut), always matching :data:`SLUG_PATTERN`.

A user-given slug (``--specperf-device``) is checked by :func:`validate_slug`.

GPU facts come from torch (name, memory, compute capability, UUID, in CUDA's device order,
which already honours ``CUDA_VISIBLE_DEVICES``) and from NVML (driver version, UUID); the
NVML device is matched to the CUDA device by UUID. Both libraries are imported lazily, and
not at all on a Linux host without a GPU's device node or driver (:func:`gpu_device_nodes`):
there torch could find no GPU, and importing it only to learn so cost every pytest start
about 1.5 s of CPU (docs/development.md, "The suite's time").
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import platform
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pytest_specperf.telemetry import loader

DeviceKind = Literal["cuda", "cpu"]

#: Allowed shape of a device slug (also for ``--specperf-device``).
SLUG_PATTERN = "[a-z0-9][a-z0-9._-]{0,79}"
MAX_SLUG_LEN = 80
_SLUG_RE = re.compile(SLUG_PATTERN)

_TRADEMARKS = re.compile(r"\((?:r|tm|c)\)", re.IGNORECASE)
_CPU_NOISE: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\s(?:with|w/)\s+radeon.*$",  # "AMD Ryzen 7 7840U w/ Radeon 780M Graphics"
        r"@\s*[\d.]+\s*[gm]hz",  # "@ 2.20GHz"
        r"\b[\w]+-core\s+processor\b",  # "64-Core Processor", "Eight-Core Processor"
        r"\bprocessor\b",
        r"\bcpu\b",  # "Intel(R) Xeon(R) CPU E5-2686 v4"
    )
)
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class DeviceInfo:
    """What a measurement ran on. ``kind`` is ``"cuda"`` or ``"cpu"``.

    GPU fields (``memory_bytes``, ``driver``, ``compute_capability``, ``uuid``,
    ``cuda_index``, ``nvml_index``) are ``None`` on a CPU and wherever the source that knows
    them (torch or NVML) is missing; ``notes`` then says why. ``cpu_model`` and ``cpu_cores``
    describe the host in both cases (host-side stalls depend on it). ``nvml_index`` is the
    index to give :class:`~pytest_specperf.telemetry.nvml.TelemetrySampler`.
    """

    kind: DeviceKind
    name: str
    slug: str
    count: int = 1
    memory_bytes: int | None = None
    driver: str | None = None
    compute_capability: str | None = None
    uuid: str | None = None
    cuda_index: int | None = None
    nvml_index: int | None = None
    cpu_model: str = ""
    cpu_cores: int = 0
    notes: tuple[str, ...] = ()
    #: the CPU's family and model numbers (``cpu_identity``): what tells apart two CPUs
    #: that a virtual machine names alike (``Intel(R) Xeon(R) Processor``); "" unknown
    cpu_id: str = ""

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def to_dict(self) -> dict[str, Any]:
        """Plain, YAML/JSON-safe mapping of every field (``notes`` as a list)."""
        out = dataclasses.asdict(self)
        out["notes"] = list(self.notes)
        return out


# --------------------------------------------------------------------------- slugs


def _clean(text: str) -> str:
    return _NON_ALNUM.sub("-", text.lower()).strip("-")


def clean_cpu_model(model: str) -> str:
    """The CPU model name without marketing noise, as a slug fragment (may be empty)."""
    text = _TRADEMARKS.sub(" ", model)
    for pattern in _CPU_NOISE:
        text = pattern.sub(" ", text)
    return _clean(text)


def slugify(
    name: str,
    *,
    kind: DeviceKind = "cuda",
    count: int = 1,
    cpu_cores: int | None = None,
) -> str:
    """Filename-safe lowercase slug for a device model (rules in the module docstring).

    ``kind="cuda"``: ``name`` is the GPU model, ``count`` the number of identical GPUs.
    ``kind="cpu"``: ``name`` is the CPU model, ``cpu_cores`` the usable core count.
    """
    if kind == "cpu":
        model = clean_cpu_model(name) or "unknown"
        suffix = f"-{cpu_cores}c" if cpu_cores else ""
        prefix = "cpu-"
    else:
        model = _clean(_TRADEMARKS.sub(" ", name)) or "unknown-gpu"
        suffix = ""
        prefix = f"{count}x-" if count > 1 else ""
    room = MAX_SLUG_LEN - len(prefix) - len(suffix)
    model = model[:room].rstrip("-") or "x"
    return f"{prefix}{model}{suffix}"


def validate_slug(slug: str) -> str:
    """Return ``slug`` if it is a valid device slug, else raise ``ValueError`` naming it.

    Valid: matches ``[a-z0-9][a-z0-9._-]{0,79}`` (lowercase letters, digits, ``.``, ``_``,
    ``-``; 1 to 80 characters), no path separator and no ``..``.
    """
    if (
        not isinstance(slug, str)
        or not _SLUG_RE.fullmatch(slug)
        or ".." in slug
        or "/" in slug
        or "\\" in slug
    ):
        raise ValueError(
            f"invalid device slug {slug!r}: expected {SLUG_PATTERN} (lowercase letters, "
            "digits, '.', '_' or '-', starting with a letter or digit, at most "
            f"{MAX_SLUG_LEN} characters), with no path separator and no '..'"
        )
    return slug


# --------------------------------------------------------------------------- CPU


def _cpuinfo_fields(cpuinfo: Path) -> dict[str, str]:
    """``/proc/cpuinfo``'s first value of each key (lowercased), {} when unreadable."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            key, value = key.strip().lower(), value.strip()
            if sep and value and key not in fields:
                fields[key] = value
    return fields


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU model string: ``/proc/cpuinfo`` (x86 ``model name``, else ARM/other keys),
    else ``platform.processor()``, else ``platform.machine()``, else ``"unknown"``."""
    fields = _cpuinfo_fields(cpuinfo)
    for key in ("model name", "hardware", "cpu model", "processor"):
        value = fields.get(key, "")
        if value and not value.isdigit():  # x86 "processor : 0" is an index
            return value
    return platform.processor() or platform.machine() or "unknown"


#: ``/proc/cpuinfo`` keys that identify a CPU design, in the order ``cpu_identity`` joins
#: them: x86 (vendor, family, model, stepping), then ARM (implementer, part, variant).
_CPU_ID_KEYS = (
    ("vendor_id", ""), ("cpu family", "family"), ("model", "model"), ("stepping", "stepping"),
    ("cpu implementer", "implementer"), ("cpu part", "part"), ("cpu variant", "variant"),
)  # fmt: skip


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU design as its numbers say it: ``GenuineIntel family 6 model 143 stepping 8``
    (x86), ``implementer 0x41 part 0xd4f variant 0x0`` (ARM); "" where ``/proc/cpuinfo``
    has none. A virtual machine's model name can be generic (``Intel(R) Xeon(R)
    Processor``, one slug for several CPU generations); these numbers are not."""
    fields = _cpuinfo_fields(cpuinfo)
    parts = [f"{label} {fields[k]}".strip() for k, label in _CPU_ID_KEYS if k in fields]
    return " ".join(parts)[:120]


def usable_cpu_cores(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """Cores this process may use: ``os.sched_getaffinity`` (else ``os.cpu_count()``),
    lowered to a cgroup-v2 CPU quota (``cpu.max``, containers) when one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    cores = cores or os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, _, period = cgroup_cpu_max.read_text().strip().partition(" ")
        if quota != "max" and period:
            cores = max(1, min(cores, math.ceil(int(quota) / int(period))))
    return cores


# --------------------------------------------------------------------------- CUDA <-> NVML


def normalize_uuid(uuid: str) -> str:
    """Lowercase UUID without NVML's ``GPU-`` prefix (torch reports it bare)."""
    text = uuid.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def match_nvml_index(
    cuda_index: int,
    cuda_uuid: str | None,
    nvml_uuids: Sequence[str],
    visible_devices: str | None,
) -> int | None:
    """The NVML index of CUDA device ``cuda_index``, or ``None`` if it cannot be told.

    By UUID when torch reports one (exact). Otherwise through ``CUDA_VISIBLE_DEVICES``
    (``visible_devices``): an integer entry is an NVML/PCI index, a ``GPU-<uuid prefix>``
    entry is matched by prefix, ``MIG-`` entries are not mapped. With the variable unset
    the CUDA index is assumed to equal the NVML index, which holds with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or identical GPUs.
    """
    norm = [normalize_uuid(u) for u in nvml_uuids]
    if cuda_uuid:
        target = normalize_uuid(cuda_uuid)
        return norm.index(target) if target in norm else None
    if visible_devices is None:
        return cuda_index if 0 <= cuda_index < len(norm) else None
    entries = [e.strip() for e in visible_devices.split(",") if e.strip()]
    if not 0 <= cuda_index < len(entries):
        return None
    entry = entries[cuda_index]
    if entry.isdigit():
        index = int(entry)
        return index if index < len(norm) else None
    if entry.lower().startswith("gpu-"):
        prefix = normalize_uuid(entry)
        hits = [i for i, u in enumerate(norm) if u.startswith(prefix)]
        return hits[0] if len(hits) == 1 else None
    return None


@contextlib.contextmanager
def nvml_session(pynvml: ModuleType) -> Iterator[str]:
    """``nvmlInit()`` ... ``nvmlShutdown()``; yields ``""`` when initialised, else the
    one-line reason it is not. Never raises an NVML error."""
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        yield f"nvmlInit failed: {loader.nvml_error_text(exc)}"
        return
    try:
        yield ""
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml_str(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nvml_uuids(pynvml: ModuleType) -> list[str]:
    count = int(pynvml.nvmlDeviceGetCount())
    return [
        _nvml_str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
        for i in range(count)
    ]


@dataclass
class _NvmlFacts:
    index: int | None = None
    driver: str | None = None
    uuid: str | None = None
    name: str | None = None
    memory_bytes: int | None = None
    compute_capability: str | None = None
    same_model_visible: int = 0


def _query_nvml(cuda_index: int, cuda_uuid: str | None, notes: list[str]) -> _NvmlFacts:
    """Driver, UUID and (for the torch-less path) name/memory/CC of one device via NVML."""
    facts = _NvmlFacts()
    imported = loader.load_pynvml()
    if imported.module is None:
        notes.append(f"NVML unavailable: {imported.reason}")
        return facts
    pynvml = imported.module
    with nvml_session(pynvml) as failure:
        if failure:
            notes.append(f"NVML unavailable: {failure}")
            return facts
        try:
            facts.driver = _nvml_str(pynvml.nvmlSystemGetDriverVersion())
            uuids = _nvml_uuids(pynvml)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            facts.index = match_nvml_index(cuda_index, cuda_uuid, uuids, visible)
            if facts.index is None:
                notes.append(
                    f"could not match CUDA device {cuda_index} to an NVML device "
                    f"(CUDA_VISIBLE_DEVICES={visible!r})"
                )
                return facts
            handle = pynvml.nvmlDeviceGetHandleByIndex(facts.index)
            facts.uuid = uuids[facts.index]
            facts.name = _nvml_str(pynvml.nvmlDeviceGetName(handle))
            facts.memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            facts.compute_capability = f"{major}.{minor}"
            names = [
                _nvml_str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(len(uuids))
            ]
            visible_idx = [match_nvml_index(i, None, uuids, visible) for i in range(len(uuids))]
            facts.same_model_visible = sum(
                1 for i in visible_idx if i is not None and names[i] == facts.name
            )
        except Exception as exc:
            notes.append(f"NVML query failed: {loader.nvml_error_text(exc)}")
    return facts


#: What a GPU's driver leaves on Linux: the device nodes of NVIDIA (``/dev/nvidiactl``,
#: ``/dev/nvidia0``...), Jetson (``/dev/nvhost-*``, ``/dev/nvmap``), WSL2 (``/dev/dxg``) and
#: ROCm (``/dev/kfd``), and the loaded kernel modules of NVIDIA and AMD (a bare-metal host
#: without udev rules gets its ``/dev/nvidia*`` nodes only when CUDA first starts, from
#: ``nvidia-modprobe``; its module is loaded before). A container given a GPU gets its nodes.
GPU_NODE_PATTERNS = (
    "/dev/nvidia*", "/dev/nvhost*", "/dev/nvmap", "/dev/dxg", "/dev/kfd",
    "/proc/driver/nvidia", "/sys/module/nvidia", "/sys/module/amdgpu",
)  # fmt: skip


def gpu_device_nodes() -> list[str] | None:
    """What of :data:`GPU_NODE_PATTERNS` is present, or ``None`` where its absence proves
    nothing: off Linux, or where ``/dev`` cannot be listed (a sandbox)."""
    if not sys.platform.startswith("linux") or not os.access("/dev", os.R_OK | os.X_OK):
        return None
    return sorted(path for pattern in GPU_NODE_PATTERNS for path in glob.glob(pattern))


def _no_gpu_node(notes: list[str]) -> bool:
    """True, with a note, on a Linux host without a GPU's device node or driver."""
    if gpu_device_nodes() != []:
        return False
    notes.append(f"no GPU device node or driver ({', '.join(GPU_NODE_PATTERNS)}): "
                 "torch and NVML not asked")
    return True


def _detect_cuda(
    cuda_index: int | None, cpu_model: str, cpu_cores: int, notes: list[str]
) -> DeviceInfo | None:
    torch = loader.import_torch()
    if torch is None:
        # No torch in this process (e.g. an external engine's venv): NVML alone, device 0 of
        # CUDA_VISIBLE_DEVICES unless told otherwise.
        index = cuda_index or 0
        facts = _query_nvml(index, None, notes)
        if facts.name is None:
            notes.append("torch not importable and NVML gave no device")
            return None
        count = max(1, facts.same_model_visible)
        return DeviceInfo(
            kind="cuda",
            name=facts.name,
            slug=slugify(facts.name, count=count),
            count=count,
            memory_bytes=facts.memory_bytes,
            driver=facts.driver,
            compute_capability=facts.compute_capability,
            uuid=facts.uuid,
            cuda_index=index,
            nvml_index=facts.index,
            cpu_model=cpu_model,
            cpu_cores=cpu_cores,
            notes=tuple(notes),
        )
    try:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            notes.append("torch reports no CUDA device")
            return None
        n = int(torch.cuda.device_count())
        index = torch.cuda.current_device() if cuda_index is None else cuda_index
        props = torch.cuda.get_device_properties(index)
        name = str(props.name)
        raw_uuid = str(getattr(props, "uuid", "") or "")
        count = sum(1 for i in range(n) if str(torch.cuda.get_device_name(i)) == name)
    except Exception as exc:
        notes.append(f"torch CUDA query failed: {type(exc).__name__}: {exc}")
        return None
    facts = _query_nvml(index, raw_uuid or None, notes)
    uuid = facts.uuid or (f"GPU-{normalize_uuid(raw_uuid)}" if raw_uuid else None)
    return DeviceInfo(
        kind="cuda",
        name=name,
        slug=slugify(name, count=count),
        count=count,
        memory_bytes=int(props.total_memory),
        driver=facts.driver,
        compute_capability=f"{props.major}.{props.minor}",
        uuid=uuid,
        cuda_index=index,
        nvml_index=facts.index,
        cpu_model=cpu_model,
        cpu_cores=cpu_cores,
        notes=tuple(notes),
    )


def detect_device(
    prefer_cuda: bool = True,
    override_slug: str | None = None,
    *,
    cuda_index: int | None = None,
) -> DeviceInfo:
    """Identify the device measurements run on; never raises for a missing library.

    With ``prefer_cuda`` and a CUDA device visible to torch: that GPU (``cuda_index``, default
    torch's current device), counted with the other visible GPUs of the same model. If torch
    itself is not importable, NVML alone is asked. Otherwise the CPU. ``override_slug``
    (``--specperf-device``) replaces the computed slug after :func:`validate_slug`, which
    raises ``ValueError`` for a bad value.

    On a CUDA machine this goes through torch's lazy CUDA initialisation in the calling
    process (device properties); call it before forking workers that use CUDA.
    """
    if override_slug is not None:
        validate_slug(override_slug)
    cpu_model = cpu_model_name()
    cpu_cores = usable_cpu_cores()
    notes: list[str] = []
    gpu = prefer_cuda and not _no_gpu_node(notes)
    info = _detect_cuda(cuda_index, cpu_model, cpu_cores, notes) if gpu else None
    if info is None:
        info = DeviceInfo(
            kind="cpu",
            name=cpu_model,
            slug=slugify(cpu_model, kind="cpu", cpu_cores=cpu_cores),
            count=1,
            cpu_model=cpu_model,
            cpu_cores=cpu_cores,
            notes=tuple(notes),
        )
    info = dataclasses.replace(info, cpu_id=cpu_identity())
    if override_slug is not None:
        info = dataclasses.replace(info, slug=override_slug)
    return info
