"""The release gate: a prompt change reaches production only through evaluation.

Pure parts (no I/O): :mod:`.binding` (what a binding declares), :mod:`.compare`
(scoring an output), :mod:`.metrics` (metrics, Wilson interval), :mod:`.decision`
(thresholds, guard, non-inferiority), :mod:`.snapshot` (what an evaluation freezes).
Roles on rows: :mod:`.roles`; inside a worker: :mod:`.service`; the Python API:
:mod:`.api`. SQL lives in :mod:`lockgate.store.gate`.
"""
