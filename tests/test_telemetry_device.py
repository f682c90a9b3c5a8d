"""Device slugs, slug validation, CPU identity and CUDA-to-NVML index matching."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specperf.telemetry import SLUG_PATTERN, slugify, validate_slug
from pytest_specperf.telemetry.device import (
    MAX_SLUG_LEN,
    clean_cpu_model,
    cpu_identity,
    cpu_model_name,
    match_nvml_index,
    normalize_uuid,
    usable_cpu_cores,
)


@pytest.mark.parametrize(
    ("name", "kwargs", "slug"),
    [
        ("NVIDIA H200", {}, "nvidia-h200"),
        ("NVIDIA H200", {"count": 2}, "2x-nvidia-h200"),
        (
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            {},
            "nvidia-rtx-pro-6000-blackwell-workstation-edition",
        ),
        ("NVIDIA H100 80GB HBM3", {}, "nvidia-h100-80gb-hbm3"),
        ("NVIDIA A100-SXM4-80GB", {"count": 8}, "8x-nvidia-a100-sxm4-80gb"),
        (
            "AMD EPYC 7B13 64-Core Processor",
            {"kind": "cpu", "cpu_cores": 2},
            "cpu-amd-epyc-7b13-2c",
        ),
        ("AMD EPYC", {"kind": "cpu", "cpu_cores": 2}, "cpu-amd-epyc-2c"),
        ("Intel(R) Xeon(R) CPU @ 2.20GHz", {"kind": "cpu", "cpu_cores": 8}, "cpu-intel-xeon-8c"),
        (
            "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz",
            {"kind": "cpu", "cpu_cores": 4},
            "cpu-intel-xeon-e5-2686-v4-4c",
        ),
        (
            "11th Gen Intel(R) Core(TM) i7-1185G7 @ 3.00GHz",
            {"kind": "cpu", "cpu_cores": 8},
            "cpu-11th-gen-intel-core-i7-1185g7-8c",
        ),
        (
            "AMD Ryzen 7 1700 Eight-Core Processor",
            {"kind": "cpu", "cpu_cores": 16},
            "cpu-amd-ryzen-7-1700-16c",
        ),
        (
            "AMD Ryzen 7 7840U w/ Radeon 780M Graphics",
            {"kind": "cpu", "cpu_cores": 16},
            "cpu-amd-ryzen-7-7840u-16c",
        ),
        ("", {"kind": "cpu", "cpu_cores": 1}, "cpu-unknown-1c"),
    ],
)
def test_slugify(name: str, kwargs: dict[str, object], slug: str) -> None:
    result = slugify(name, **kwargs)  # type: ignore[arg-type]
    assert result == slug
    assert validate_slug(result) == result


def test_slug_is_capped_and_still_valid() -> None:
    slug = slugify("Very Long " * 20, kind="cpu", cpu_cores=128)
    assert len(slug) <= MAX_SLUG_LEN
    assert slug.endswith("-128c") and "--" not in slug
    validate_slug(slug)
    gpu = slugify("X" * 200, count=16)
    assert len(gpu) <= MAX_SLUG_LEN and gpu.startswith("16x-")
    validate_slug(gpu)


def test_clean_cpu_model_drops_marketing_noise() -> None:
    assert clean_cpu_model("Intel(R) Core(TM) i9-13900K") == "intel-core-i9-13900k"
    assert clean_cpu_model("AMD EPYC 9654 96-Core Processor") == "amd-epyc-9654"


@pytest.mark.parametrize(
    "good", ["nvidia-h200", "2x-nvidia-h200", "cpu-amd-epyc-2c", "a", "9.0_x-y", "a" * 80]
)
def test_validate_slug_accepts(good: str) -> None:
    assert validate_slug(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "NVIDIA-H200",
        "-leading",
        ".hidden",
        "a/b",
        "a\\b",
        "a..b",
        "..",
        "has space",
        "a" * 81,
        "é",
    ],
)
def test_validate_slug_rejects_naming_value_and_pattern(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_slug(bad)
    message = str(info.value)
    assert repr(bad) in message
    assert SLUG_PATTERN in message
    assert "path separator" in message and "'..'" in message


def test_cpu_model_name_from_cpuinfo(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n"
        "\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n"
    )
    assert cpu_model_name(x86) == "AMD EPYC 7B13 64-Core Processor"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n\nHardware\t: Neoverse-V2 board\n")
    assert cpu_model_name(arm) == "Neoverse-V2 board"
    assert cpu_model_name(tmp_path / "missing")  # platform fallback, never empty


def test_cpu_identity_tells_apart_cpus_a_vm_names_alike(tmp_path: Path) -> None:
    """Two KVM guests that both say ``Intel(R) Xeon(R) Processor`` (one slug) on CPUs of
    two generations: their family and model numbers differ, and the device record keeps
    them (``DeviceInfo.cpu_id``)."""
    from pytest_specperf.judging.baselines import cpu_changed

    def guest(model: int, stepping: int) -> Path:
        p = tmp_path / f"m{model}"
        p.write_text(
            f"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: {model}\n"
            f"model name\t: Intel(R) Xeon(R) Processor\nstepping\t: {stepping}\n\n"
            f"processor\t: 1\nvendor_id\t: GenuineIntel\nmodel\t\t: {model}\n"
        )
        return p

    old, new = guest(143, 8), guest(167, 1)
    assert cpu_model_name(old) == cpu_model_name(new) == "Intel(R) Xeon(R) Processor"
    assert cpu_identity(old) == "GenuineIntel family 6 model 143 stepping 8"
    assert cpu_identity(new) == "GenuineIntel family 6 model 167 stepping 1"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nCPU implementer\t: 0x41\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n")
    assert cpu_identity(arm) == "implementer 0x41 part 0xd4f variant 0x0"
    assert cpu_identity(tmp_path / "missing") == ""

    def device(path: Path, kind: str = "cpu") -> dict[str, str]:
        return {"kind": kind, "slug": "cpu-intel-xeon-2c", "name": cpu_model_name(path),
                "cpu_id": cpu_identity(path)}  # fmt: skip

    note = cpu_changed(device(old), device(new))
    assert note is not None and "model 143 stepping 8' then" in note
    assert "model 167 stepping 1' now" in note and "--specperf-ab" in note
    recording = cpu_changed(device(old), device(new), recording=True)
    assert recording is not None and "this update adds its runs beside" in recording
    assert cpu_changed(device(new), device(new)) is None
    assert cpu_changed({"kind": "cpu", "slug": "cpu-intel-xeon-2c"}, device(new)) is None  # older file
    assert cpu_changed(device(old, "cuda"), device(new, "cuda")) is None  # a GPU's file


def test_usable_cpu_cores_respects_cgroup_quota(tmp_path: Path) -> None:
    unlimited = tmp_path / "max"
    unlimited.write_text("max 100000\n")
    base = usable_cpu_cores(unlimited)
    assert base >= 1
    assert usable_cpu_cores(tmp_path / "absent") == base
    quota = tmp_path / "quota"
    quota.write_text("150000 100000\n")  # 1.5 CPUs -> 2 cores at most
    assert usable_cpu_cores(quota) == min(base, 2)


NVML_UUIDS = [
    "GPU-aaaaaaaa-1111-2222-3333-444444444444",
    "GPU-bbbbbbbb-1111-2222-3333-444444444444",
    "GPU-cccccccc-1111-2222-3333-444444444444",
]


@pytest.mark.parametrize(
    ("cuda_index", "cuda_uuid", "visible", "expected"),
    [
        (0, "bbbbbbbb-1111-2222-3333-444444444444", None, 1),  # by UUID, torch style
        (0, "GPU-CCCCCCCC-1111-2222-3333-444444444444", "0", 2),  # UUID wins over env
        (0, "dddddddd-0000-0000-0000-000000000000", None, None),  # unknown UUID
        (1, None, None, 1),  # no env: same index
        (5, None, None, None),
        (0, None, "2,0", 2),
        (1, None, " 2 , 0 ", 0),
        (2, None, "2,0", None),
        (0, None, "GPU-bbbb", 1),  # UUID prefix
        (0, None, "GPU-", None),  # ambiguous prefix
        (0, None, "MIG-1234", None),
        (0, None, "", None),
    ],
)
def test_match_nvml_index(
    cuda_index: int, cuda_uuid: str | None, visible: str | None, expected: int | None
) -> None:
    assert match_nvml_index(cuda_index, cuda_uuid, NVML_UUIDS, visible) == expected


def test_normalize_uuid() -> None:
    assert normalize_uuid(" GPU-ABC ") == "abc"
    assert normalize_uuid("abc") == "abc"
