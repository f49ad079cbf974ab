"""A benchmark run as data: metadata plus every measurement with its raw samples.

The JSON written here is the committed format under ``benchmarks/results/``; the tables
and plots are rendered from it (``tilegemm bench --from-json FILE``), so a table in the
README can always be regenerated from the file it came from.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilegemm.bench.timing import FAILED, Measurement
from tilegemm.errors import InvalidValueError

SCHEMA = "tilegemm-bench/1"
# The parts of ``meta`` the tables read as objects (key -> value).
_META_OBJECTS: tuple[str, ...] = ("settings", "host", "versions", "backends", "vendors",
                                  "vendor_names", "rivals")
# Objects inside those: (parent, key), where key "*" means every value of the parent.
_NESTED_OBJECTS: tuple[tuple[str, str], ...] = (("settings", "policy"), ("host", "env"),
                                                ("backends", "*"), ("rivals", "*"))


@dataclass
class Results:
    meta: dict[str, Any] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)

    def for_report(self, report: str, backend: str | None = None) -> list[Measurement]:
        return [m for m in self.measurements
                if report in m.reports and (backend is None or m.backend == backend)]

    def backends(self, report: str | None = None) -> list[str]:
        seen: list[str] = []
        for m in self.measurements:
            if (report is None or report in m.reports) and m.backend not in seen:
                seen.append(m.backend)
        return seen

    def select(self, reports: list[str] | None) -> Results:
        """The run as if only ``reports`` had been asked (None: all of it): measurements of
        no such report dropped, the others keeping only those reports, so a file written
        from it renders the same tables again."""
        if reports is None:
            return self
        wanted = set(reports)
        kept = [dataclasses.replace(m, reports=[r for r in m.reports if r in wanted])
                for m in self.measurements if wanted & set(m.reports)]
        meta = dict(self.meta)
        if isinstance(meta.get("settings"), dict):
            meta["settings"] = {**meta["settings"], "reports": list(reports)}
        return Results(meta, kept)

    @property
    def failed(self) -> list[Measurement]:
        return [m for m in self.measurements if m.status == FAILED]

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "meta": self.meta,
                           "measurements": [m.to_dict() for m in self.measurements]},
                          indent=1, default=str)

    @classmethod
    def from_json(cls, text: str, name: str = "") -> Results:
        """Results from the text of a results file; ``name`` (the file) prefixes messages.

        Anything that is not a results file this tilegemm can render (not JSON, another
        schema, a measurement with a missing or mistyped field) raises InvalidValueError:
        the file is the caller's input, so a damaged one is refused, not a crash.
        """
        where = f"{name}: " if name else ""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidValueError(f"{where}not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise InvalidValueError(f"{where}not a tilegemm benchmark file (expected schema "
                                    f"{SCHEMA!r})")
        if "measurements" not in data:  # (an empty report, exit 0, before)
            raise InvalidValueError(f"{where}damaged tilegemm benchmark file: no "
                                    "'measurements'")
        meta, rows = data.get("meta", {}), data["measurements"]
        if not isinstance(meta, dict) or not isinstance(rows, list):
            raise InvalidValueError(f"{where}damaged tilegemm benchmark file: 'meta' must be "
                                    "an object and 'measurements' a list")
        bad = [k for k in _META_OBJECTS if not isinstance(meta.get(k, {}), dict)]
        for parent, key in _NESTED_OBJECTS if not bad else ():
            inside = meta.get(parent, {})
            values = inside.items() if key == "*" else [(key, inside.get(key, {}))]
            bad += [f"{parent}.{k}" for k, v in values if not isinstance(v, dict)]
        if bad:
            raise InvalidValueError(f"{where}damaged tilegemm benchmark file: meta "
                                    f"{' and '.join(map(repr, bad))} must be "
                                    + ("objects" if len(bad) > 1 else "an object"))
        measurements = []
        for i, row in enumerate(rows):
            try:
                measurements.append(Measurement.from_dict(row))
            except ValueError as exc:
                raise InvalidValueError(f"{where}damaged tilegemm benchmark file: measurement "
                                        f"{i}: {exc}") from None
        return cls(dict(meta), measurements)

    @classmethod
    def load(cls, path: str | Path) -> Results:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidValueError(f"results file {str(path)!r} does not exist") from None
        except IsADirectoryError:
            raise InvalidValueError(f"{path} is a directory, not a results file (the JSON "
                                    "file a run wrote with --output or --save)") from None
        except UnicodeDecodeError:
            raise InvalidValueError(f"{path}: not a tilegemm benchmark file (not UTF-8 text; "
                                    "results files are JSON)") from None
        return cls.from_json(text, str(path))

    def device_slug(self) -> str:
        """``<device>`` part of a results file name, short and readable: the first
        accelerated backend's device (``nvidia-h100-80gb-hbm3``, ``opencl-pocl-amd-epyc``),
        else ``cpu-<cpu model>``."""
        from tilegemm.backends import get_backend
        from tilegemm.bench.environment import short_slug
        from tilegemm.registry import BACKENDS

        infos = self.meta.get("backends", {})
        ran = self.backends()
        for name in BACKENDS:
            info = infos.get(name)
            if not (info and name in ran and info.get("device")):
                continue
            backend = get_backend(name)
            if backend.array_kind != "host":
                return backend.results_prefix(info) + short_slug(info["device"])
        return "cpu-" + short_slug(self.meta.get("host", {}).get("cpu", "cpu"))

    def default_stem(self) -> str:
        """``<device-slug>-<date>`` for ``benchmarks/results/``."""
        when = self.meta.get("created", "")[:10] or _dt.date.today().isoformat()
        return f"{self.device_slug()}-{when}"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
