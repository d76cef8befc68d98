"""The quality loop: rollups of every attempt's quality figures per prompt version,
model and endpoint (:mod:`~lockgate.quality.rollup`, kept by
:mod:`~lockgate.quality.writer` as attempts are written), their reports
(:mod:`~lockgate.quality.report`), OpenTelemetry GenAI spans of every call
(:mod:`~lockgate.quality.tracing`), and the alerts one leased evaluator keeps from the
anomaly rules (:mod:`~lockgate.quality.alerts`, :mod:`~lockgate.quality.webhooks`,
:mod:`~lockgate.quality.service`)."""

from __future__ import annotations

from lockgate.quality.report import QualityRow, quality_report
from lockgate.quality.rollup import Key, Rollup, Watch, watch_of
from lockgate.quality.tracing import Tracing
from lockgate.quality.writer import QualityObserver, RollupWriter, quality_observer

__all__ = ["Key", "QualityObserver", "QualityRow", "Rollup", "RollupWriter", "Tracing",
           "Watch", "quality_observer", "quality_report", "watch_of"]
