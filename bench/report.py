"""Measurements and how they are shown: an aligned text table, or Markdown rows for docs/benchmarks.md."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    scenario: str
    variant: str
    metric: str
    unit: str
    value: float


_FORMATS = {"msg/s": "{:,.0f}", "conn/s": "{:,.0f}", "ms": "{:.2f}", "MiB": "{:,.1f}", "KiB": "{:,.1f}",
            "cores": "{:.2f}"}


def format_value(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return _FORMATS.get(unit, "{:.3g}").format(value)


class Results:
    """Every measurement of a run, by row (scenario, variant, metric) and target label."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels
        self.rows: dict[tuple[str, str, str], dict[str, list[float]]] = {}
        self.units: dict[tuple[str, str, str], str] = {}
        self.errors: list[tuple[str, str, str, str]] = []  # scenario, variant, label, text

    def add(self, label: str, measurement: Measurement) -> None:
        key = (measurement.scenario, measurement.variant, f"{measurement.metric} ({measurement.unit})")
        self.units[key] = measurement.unit
        self.rows.setdefault(key, {}).setdefault(label, []).append(measurement.value)

    def add_error(self, scenario: str, variant: str, label: str, text: str) -> None:
        self.errors.append((scenario, variant, label, text))
        key = (scenario, variant, "error")
        self.units[key] = ""
        self.rows.setdefault(key, {})[label] = []

    def _cells(self, key: tuple[str, str, str]) -> list[str]:
        unit = self.units[key]
        cells = []
        for label in self.labels:
            values = self.rows[key].get(label)
            if key[2] == "error":
                cells.append("FAILED" if values is not None else "ok")
            elif not values:
                cells.append("-")
            else:
                cells.append(format_value(statistics.median(values), unit))
        if len(self.labels) == 2 and key[2] != "error" and not key[2].startswith("client CPU"):
            a, b = (self.rows[key].get(label) for label in self.labels)
            ratio = statistics.median(a) / statistics.median(b) if a and b and statistics.median(b) else None
            cells.append("-" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}")
        elif len(self.labels) == 2:
            cells.append("")  # errors, and client CPU (a diagnostic: a ratio of two near-zero figures says nothing)
        return cells

    def _header(self) -> list[str]:
        header = ["scenario", "variant", "metric", *self.labels]
        if len(self.labels) == 2:
            header.append(f"{self.labels[0]}/{self.labels[1]}")
        return header

    def table(self) -> str:
        rows = [self._header()] + [[*key, *self._cells(key)] for key in self.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = []
        for n, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths))))
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def markdown(self) -> str:
        header = self._header()
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|"]
        lines += ["| " + " | ".join([*key, *self._cells(key)]) + " |" for key in self.rows]
        return "\n".join(lines)

    def error_report(self) -> str:
        return "\n\n".join(f"[{label}] {scenario} / {variant}:\n{text}"
                           for scenario, variant, label, text in self.errors)
