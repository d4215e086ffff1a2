"""Price tables for `seed-report`: USD per hour for a vCPU and for one accelerator device.

Two tables ship as package data and are picked by name; any other YAML file of the same shape by path:

  current  pricing_current.yaml     today's on-demand list prices (H100, H200, A100, L4, a vCPU); the default
  paper    pricing_paper_2019.yaml  the SEED RL paper's 2019 prices (P100, TPU v3 core, a CPU core)

A device is priced by the key whose words all occur among the words of the device's name, as a driver
reports it ("NVIDIA H100 80GB HBM3" -> H100; "NVIDIA A100-SXM4-80GB" -> A100 80GB); a device no key matches
is an error, never free.
"""

from __future__ import annotations

import dataclasses
import os
import re
from importlib import resources

TABLES = {"current": "pricing_current.yaml", "paper": "pricing_paper_2019.yaml"}


class PricingError(ValueError):
    """The pricing table is malformed or lacks a price for a device a result used."""


def words(name: str) -> list[str]:
    """Lower-case runs of letters and digits: "NVIDIA A100-SXM4-80GB" -> ["nvidia", "a100", "sxm4", "80gb"]."""
    return re.findall(r"[a-z0-9]+", name.lower())


@dataclasses.dataclass
class Pricing:
    """One price table. Prices are in `currency` per hour: `cpu_core` per vCPU, `accelerators` per device."""

    cpu_core: float
    accelerators: dict[str, float]  # pricing key -> price of one device per hour
    path: str  # the file it was read from
    name: str  # "current", "paper", or the path of a user's file
    source: str = ""  # where the prices come from, as the file says
    as_of: str = ""  # the date the prices are from, as the file says
    currency: str = "USD"
    shown_path: str = ""  # how reports name the file: seed/bench/<file> for a shipped table, else `path`

    def describe(self) -> str:
        """One line for reports: which table, its source and date."""
        details = "; ".join(x for x in (self.source, f"as of {self.as_of}" if self.as_of else "") if x)
        return f"the {self.name} price table" + (f" ({details})" if details else "")

    def accelerator_key(self, device: str) -> str | None:
        """The pricing key for `device`: all its words occur in the device's name; most words, then longest."""
        device_words = set(words(device))
        matches = [key for key in self.accelerators if words(key) and set(words(key)) <= device_words]
        return max(matches, key=lambda key: (len(words(key)), len(key))) if matches else None

    def accelerator_price(self, device: str) -> float:
        key = self.accelerator_key(device)
        if key is None:
            known = ", ".join(self.accelerators) or "none"
            other = [name for name in TABLES if name != self.name]
            raise PricingError(
                f"no price for device {device!r} in {self.describe()}, {self.path} (priced accelerators: {known}); "
                f"use --pricing={'|'.join(other) or 'PATH'} or a copy of {self.path} with a line "
                f"'  {device}: <price per hour>' under 'accelerators:' (--pricing=PATH)")
        return self.accelerators[key]


def _price(value: object, where: str, path: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise PricingError(f"{path}: {where}: got {value!r}, expected a price per hour >= 0")
    return float(value)


def load_pricing(path: str, name: str | None = None) -> Pricing:
    """Reads a price table from a YAML file (see pricing_current.yaml for the format)."""
    import yaml

    if not os.path.isfile(path):
        raise PricingError(f"--pricing: got {path!r}, expected {' or '.join(TABLES)} or an existing YAML file")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict) or "cpu_core" not in data:
        raise PricingError(f"{path}: expected a mapping with cpu_core (price per core per hour) and accelerators")
    accelerators = data.get("accelerators") or {}
    if not isinstance(accelerators, dict):
        raise PricingError(f"{path}: accelerators: expected a mapping of device name to price per hour")
    prices = {str(key): _price(value, f"accelerators.{key}", path) for key, value in accelerators.items()}
    return Pricing(_price(data["cpu_core"], "cpu_core", path), prices, path, name or str(data.get("name") or path),
                   str(data.get("source", "")), str(data.get("as_of", "")), str(data.get("currency", "USD")), path)


def table_path(name: str) -> str:
    """The file of a shipped table ("current" or "paper"), inside the installed package."""
    return str(resources.files("seed.bench").joinpath(TABLES[name]))


def resolve_pricing(value: str) -> Pricing:
    """--pricing: "current", "paper" (the shipped tables) or the path of a YAML file."""
    if value in TABLES:
        return dataclasses.replace(load_pricing(table_path(value), value), shown_path=f"seed/bench/{TABLES[value]}")
    return load_pricing(value, value)
