"""The prompt registry: prompts, immutable versions, labels, rollback, datasets.

:mod:`.refs` (reference syntax), :mod:`.content` (a version's content: validate, hash,
read, diff), :mod:`.datasets` (dataset files), :mod:`.resolver` (what a worker runs for
``@registry:`` references), :mod:`.api` (``lg.prompts``, ``lg.datasets``). SQL lives in
:mod:`lockgate.store.registry`.
"""
