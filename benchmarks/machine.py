"""A description of the machine a benchmark ran on, and whether it has a CUDA GPU."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        return None


def gpus() -> list[str]:
    """Names of the NVIDIA GPUs ``nvidia-smi`` lists; empty when there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cpu_seconds() -> float | None:
    """CPU seconds this whole machine has spent busy since it booted (every process, this
    one's or not: ``/proc/stat``); None where that cannot be read. Two readings a wall
    interval apart give the machine's load in CPU seconds per wall second."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def describe() -> dict[str, Any]:
    """Platform, Python, CPU, memory and GPUs of this machine."""
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": gpus(),
    }
