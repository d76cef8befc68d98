"""The quality loop: rollups of every attempt's quality figures per prompt version,
model and endpoint (:mod:`~lockgate.quality.rollup`, kept by
:mod:`~lockgate.quality.writer` as attempts are written), and their reports
(:mod:`~lockgate.quality.report`)."""

from __future__ import annotations

from lockgate.quality.report import QualityRow, quality_report
from lockgate.quality.rollup import Key, Rollup, Watch, watch_of
from lockgate.quality.writer import RollupWriter, rollup_observer

__all__ = ["Key", "QualityRow", "Rollup", "RollupWriter", "Watch", "quality_report",
           "rollup_observer", "watch_of"]
