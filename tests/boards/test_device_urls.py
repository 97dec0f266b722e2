"""A target's `connect:`: the URLs that work, and a clear reason for those that do not."""

from __future__ import annotations

import pytest

from orchestrator.boards.urls import DeviceURLError, parse_device_url


@pytest.mark.parametrize(("text", "fields"), [
    ("ssh://pi@192.168.1.20", {"scheme": "ssh", "user": "pi", "host": "192.168.1.20",
                               "port": None, "python": "python3", "emulated": False}),
    ("ssh://board:2222", {"user": None, "host": "board", "port": 2222}),
    ("ssh://me@host?python=/opt/venv/bin/python", {"python": "/opt/venv/bin/python"}),
    ("qemu://aarch64?cpu=cortex-a72", {"scheme": "qemu", "host": "aarch64",
                                       "cpu": "cortex-a72", "emulated": True}),
    ("qemu://aarch64", {"cpu": "cortex-a76"}),
])
def test_urls_that_work(text: str, fields: dict) -> None:
    url = parse_device_url(text)
    assert url.text == text
    for name, value in fields.items():
        assert getattr(url, name) == value, name


@pytest.mark.parametrize(("text", "says"), [
    ("pi@192.168.1.20", "is not a device URL: use ssh://"),
    ("adb://phone", "is not a device URL"),
    ("ssh://pi:secret@board", "a password never goes in a recipe"),
    ("ssh://", "names no host"),
    ("ssh://board?cpu=x", "unknown option 'cpu'"),
    ("ssh://board:99999", "Port out of range"),
    ("qemu://x86_64", "the emulated board is one of aarch64"),
    ("qemu://aarch64?python=x", "unknown option 'python'"),
])
def test_urls_that_do_not_say_why(text: str, says: str) -> None:
    with pytest.raises(DeviceURLError) as caught:
        parse_device_url(text)
    assert says in str(caught.value)
    assert "secret" not in str(caught.value)  # a password is never echoed

