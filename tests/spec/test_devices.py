"""The device catalogue: presets, latency estimates, precision detection, import cost."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from orchestrator.spec.devices import (
    PRESETS,
    Device,
    estimate_latency_ms,
    precision_of,
    resolve_device,
)


def test_presets_carry_spec_figures() -> None:
    assert set(PRESETS) >= {"phone-2016", "phone-modern", "raspberry-pi-3", "hikey-960",
                            "x86-server"}
    assert PRESETS["phone-2016"].flops_per_second == 20e9
    assert PRESETS["phone-modern"].flops_per_second == 10e9
    pi = PRESETS["raspberry-pi-3"]
    assert (pi.flops_per_second, pi.cores, pi.ram_mb) == (5e9, 4, 1024)
    assert PRESETS["phone-2016"].app_ram_limit_mb == 100
    for name, device in PRESETS.items():
        assert device.name == name
        assert device.precision_factors["float32"] == 1.0


def test_int8_is_faster_on_arm_and_slower_on_x86() -> None:
    assert PRESETS["phone-2016"].precision_factors["int8"] == pytest.approx(935 / 1794, 0.01)
    assert PRESETS["raspberry-pi-3"].precision_factors["int8"] < 1
    assert PRESETS["x86-server"].precision_factors["int8"] > 1


def test_hikey_preset_reproduces_the_measured_resnet50() -> None:
    # ResNet-50: about 8.2 GFLOP (4.1 G multiply-adds); SPEC: fp32 567 ms, int8 522 ms
    # on the HiKey 960's 4 cores.
    hikey = PRESETS["hikey-960"]
    assert estimate_latency_ms(8.2e9, hikey, "float32") == pytest.approx(567, rel=0.02)
    assert estimate_latency_ms(8.2e9, hikey, "int8") == pytest.approx(522, rel=0.02)


def test_estimate_math() -> None:
    phone = resolve_device("phone-2016")
    assert estimate_latency_ms(20e9, phone, "float32") == pytest.approx(1000.0)
    assert estimate_latency_ms(20e9, phone, "int8") == pytest.approx(520.0)
    assert estimate_latency_ms(1e6, phone) == pytest.approx(0.05)
    # an unlisted precision runs at float32 speed
    assert estimate_latency_ms(20e9, phone, "float16") == pytest.approx(1000.0)


def test_unknown_preset_suggests_the_closest() -> None:
    with pytest.raises(ValueError) as info:
        resolve_device("phone-2061")
    message = str(info.value)
    assert 'did you mean "phone-2016"' in message
    for name in PRESETS:
        assert name in message


def test_inline_device() -> None:
    device = Device(flops_per_second=1e9, cores=2, ram_mb=512,
                    precision_factors={"int8": 0.6})
    assert resolve_device(device) is device
    assert device.precision_factors == {"float32": 1.0, "int8": 0.6}
    assert device.ram_limit_mb == 512
    assert PRESETS["phone-2016"].ram_limit_mb == 100
    with pytest.raises(ValidationError):
        Device(flops_per_second=1e9, cores=2, ram_mb=512, gpu=True)
    with pytest.raises(ValidationError):
        Device(flops_per_second=0, cores=2, ram_mb=512)


def test_precision_of() -> None:
    assert precision_of({"Conv2D": 2, "MatMul": 1}) == "float32"
    assert precision_of({"QuantizedConv2D": 2, "Dequantize": 1}) == "int8"
    assert precision_of({"QuantizedMatMul": 0}) == "float32"
    assert precision_of({}) == "float32"


def test_import_is_cheap() -> None:
    code = ("import sys, orchestrator.spec.devices; "
            "print(sorted(m for m in ('numpy', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
