"""The quality loop: rollups of every attempt's quality figures per prompt version,
model and endpoint (:mod:`~lockgate.quality.rollup`, kept by
:mod:`~lockgate.quality.writer` as attempts are written), their reports
(:mod:`~lockgate.quality.report`), OpenTelemetry GenAI spans of every call
(:mod:`~lockgate.quality.tracing`), and the alerts one leased evaluator keeps from the
anomaly rules (:mod:`~lockgate.quality.alerts`, :mod:`~lockgate.quality.webhooks`,
:mod:`~lockgate.quality.service`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockgate.lazy import lazy_names as _lazy_names

#: The groupings of a quality report (:func:`~lockgate.quality.report.quality_report`),
#: here so that the command line names them without loading the reports.
BY: tuple[str, ...] = ("version", "model", "hour")

if TYPE_CHECKING:
    from lockgate.quality.report import QualityRow, quality_report
    from lockgate.quality.rollup import Key, Rollup, Watch, watch_of
    from lockgate.quality.tracing import Tracing
    from lockgate.quality.writer import QualityObserver, RollupWriter, quality_observer

#: Where each name of the package lives: imported when first asked for, so that the
#: span exporter process (:mod:`lockgate.quality.otel_child`) loads tracing alone.
_HOMES = {"QualityRow": "report", "quality_report": "report", "Key": "rollup",
          "Rollup": "rollup", "Watch": "rollup", "watch_of": "rollup",
          "Tracing": "tracing", "QualityObserver": "writer", "RollupWriter": "writer",
          "quality_observer": "writer"}


__getattr__, __dir__ = _lazy_names(__name__, _HOMES)


__all__ = ["BY", "Key", "QualityObserver", "QualityRow", "Rollup", "RollupWriter", "Tracing",
           "Watch", "quality_observer", "quality_report", "watch_of"]
