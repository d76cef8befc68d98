"""Every SQL statement of the quality alerts: the role lease (``role_lease``), the alerts
(``quality_alert``), their samples (``quality_alert_sample``) and the webhook outbox
(``alert_delivery``), see store/schema.py.

Every change of state is a conditional UPDATE (or an INSERT a unique key guards):

* a role is claimed only when its lease has run out (or is already ours) and renewed
  only by the token that holds it; a write of the role renews in its own transaction
  first (:meth:`AlertStore.fence`), so a holder whose lease was taken over writes
  nothing;
* at most one alert per key is OPEN: ``open_key`` is unique and set only while OPEN;
* a delivery is claimed by moving ``next_at`` past its timeout under a fresh token, and
  only that token may mark it DELIVERED, retry it or fail it.

Reads of ``task_attempt`` (samples, batches touched) are bounded: an index range of one
prompt version and a time span, newest first, with a LIMIT.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from lockgate.errors import NotFound
from lockgate.spec import RESERVED_ID_PREFIX
from lockgate.store import schema
from lockgate.store.store import Store
from lockgate.store.tx import Tx, sql

OPEN = "OPEN"
RESOLVED = "RESOLVED"

# -- role lease -----------------------------------------------------------------------
_LEASE_ROW = sql("SELECT name FROM role_lease WHERE name = :n")
_LEASE_CLAIM = sql(
    "UPDATE role_lease SET holder = :h, token = :t, lease_until = :now + :ms, "
    "acquired_at = :now, updated_at = :now "
    "WHERE name = :n AND (lease_until <= :now OR token = :t)")
_LEASE_RENEW = sql(
    "UPDATE role_lease SET lease_until = :now + :ms, updated_at = :now "
    "WHERE name = :n AND token = :t AND lease_until > :now")
_LEASE_RELEASE = sql(
    "UPDATE role_lease SET lease_until = :now, updated_at = :now "
    "WHERE name = :n AND token = :t")
_LEASE_GET = sql("SELECT name, holder, token, lease_until, acquired_at FROM role_lease "
                 "WHERE name = :n")

# -- alerts -----------------------------------------------------------------------------
_COLS = ("id, alert_key, rule, prompt, model, subject, status, window_s, value, baseline, "
         "threshold, calls, tasks, batches, batches_exact, onset_at, opened_at, updated_at, "
         "notified_at, resolved_at, acked_at, acked_by, ack_reason, version")
_OPEN_ALERTS = sql(f"SELECT {_COLS} FROM quality_alert WHERE status = 'OPEN' ORDER BY id")
_ALERTS = sql(f"SELECT {_COLS} FROM quality_alert ORDER BY id DESC LIMIT :lim")
_NEWEST_OPEN = sql(f"SELECT {_COLS} FROM quality_alert WHERE status = 'OPEN' "
                   "ORDER BY id DESC LIMIT :lim")
_ALERT = sql(f"SELECT {_COLS} FROM quality_alert WHERE id = :id")
_LAST_RESOLVED = sql("SELECT MAX(resolved_at) FROM quality_alert "
                     "WHERE alert_key = :k AND resolved_at IS NOT NULL")
_KEY_SEEN = sql("SELECT id FROM quality_alert WHERE alert_key = :k")
_NEWEST_OPENED = sql("SELECT MAX(opened_at) FROM quality_alert "
                     "WHERE rule = :r AND prompt = :p")
_UPDATE = sql(
    "UPDATE quality_alert SET value = :value, baseline = :baseline, "
    "threshold = :threshold, calls = :calls, tasks = :tasks, batches = :batches, "
    "batches_exact = :batches_exact, updated_at = :now, notified_at = :notified_at, "
    "version = version + 1 WHERE id = :id AND status = 'OPEN'")
_RESOLVE = (
    "UPDATE quality_alert SET status = 'RESOLVED', open_key = NULL, resolved_at = :now, "
    "updated_at = :now, notified_at = :now, version = version + 1{figures} "
    "WHERE id = :id AND status = 'OPEN'")
#: The figures a resolve may write: those of the evaluation that cleared the rule.
_RESOLVE_FIGURES = ("value", "baseline", "threshold", "calls", "window_s")
_ACK = sql(
    "UPDATE quality_alert SET acked_at = :now, acked_by = :by, ack_reason = :reason "
    "WHERE id = :id AND acked_at IS NULL")

# -- samples ----------------------------------------------------------------------------
_SAMPLE_COUNT = sql("SELECT COUNT(*) FROM quality_alert_sample WHERE alert_id = :id")
_SAMPLE_IDS = sql("SELECT attempt_id FROM quality_alert_sample WHERE alert_id = :id")
_SAMPLES = sql(
    "SELECT attempt_id, task_id, batch_id, started_at, latency_ms, endpoint, parse_status, "
    "completeness, error_class, error_message, prompt_snapshot, raw_output "
    "FROM quality_alert_sample WHERE alert_id = :id ORDER BY started_at DESC, attempt_id "
    "DESC")
#: Recent attempts of one registry prompt version and model (or of inline prompts,
#: version NULL), newest first: the light columns a rule picks its samples from.
_CANDIDATES = (
    "SELECT a.id, a.started_at, a.latency_ms, a.parse_status, a.completeness, a.outcome, "
    "a.prompt_version, t.config_hash, {result} AS result FROM task_attempt a "
    "JOIN task t ON t.id = a.task_pk "
    "WHERE {version} AND a.started_at >= :since AND a.started_at < :until "
    "{model} ORDER BY a.started_at DESC LIMIT :lim")
_HEAVY = sql(
    "SELECT a.id, t.task_id, t.batch_id, a.started_at, a.latency_ms, a.endpoint, "
    "a.parse_status, a.completeness, a.error_class, a.error_message, a.prompt_snapshot, "
    "a.raw_output FROM task_attempt a JOIN task t ON t.id = a.task_pk WHERE a.id IN :ids",
    "ids")
#: Batches touched since onset: over the newest ``lim`` attempts of the version.
_TOUCHED = (
    "SELECT t.batch_id, t.config_hash, a.prompt_version FROM (SELECT a.task_pk, "
    "a.prompt_version FROM task_attempt a WHERE {version} AND a.started_at >= :since "
    "{model} ORDER BY a.started_at DESC LIMIT :lim) a "
    "JOIN task t ON t.id = a.task_pk")
#: Tasks ended (an attempt of a terminal outcome, as the rollups count ``tasks``) by
#: attempts of a version started in [since, until), release-gate batches left out: the
#: part of a minute after an onset inside it (one index range, a minute at most).
_ENDED = (
    "SELECT COUNT(*) FROM task_attempt a JOIN task t ON t.id = a.task_pk "
    "WHERE {version} AND a.started_at >= :since AND a.started_at < :until "
    "AND a.outcome IN ('succeeded', 'failed', 'dead', 'resolved') "
    "AND t.batch_id NOT LIKE :gate {model}")
#: The same for inline prompts, over the tasks of some configs (another inline prompt on
#: the same model, however busy, does not use up the newest ``lim``).
_TOUCHED_CONFIGS = (
    "SELECT t.batch_id, t.config_hash, a.prompt_version FROM task_attempt a "
    "JOIN task t ON t.id = a.task_pk WHERE a.prompt_version IS NULL "
    "AND t.config_hash IN :cfg AND a.started_at >= :since {model} "
    "ORDER BY a.started_at DESC LIMIT :lim")


def _version_cond(version: str | None, configs: Sequence[str] | None) -> str:
    if version is not None:
        return "a.prompt_version = :v"
    if configs is None:
        return "a.prompt_version IS NULL"
    return "a.prompt_version IS NULL AND t.config_hash IN :cfg"

# -- outbox -----------------------------------------------------------------------------
#: Due deliveries to the webhooks a sender knows (``known``: its configuration's names):
#: a delivery to a webhook it does not know stays PENDING, for a sender that knows it,
#: and is not read, so it takes no place of the LIMIT. A delivery waits while an
#: earlier one of its alert to its webhook is PENDING (under way, or retried later):
#: a webhook gets an alert's events in the order they were written, so a retried
#: ``open`` is never overtaken by its ``resolve``. (Read here, not in the claim's
#: UPDATE: MySQL cannot read the updated table in a subquery of an UPDATE.)
_DUE = sql("SELECT id, target FROM alert_delivery WHERE status = 'PENDING' "
           "AND next_at <= :now AND target IN :known AND NOT EXISTS (SELECT 1 FROM "
           "alert_delivery e WHERE e.alert_id = alert_delivery.alert_id "
           "AND e.target = alert_delivery.target AND e.status = 'PENDING' "
           "AND e.id < alert_delivery.id) ORDER BY next_at, id LIMIT :lim",
           "known")
#: PENDING deliveries per webhook: how many, and the oldest's creation (ms).
_WAITING = sql("SELECT target, COUNT(*) AS pending, MIN(created_at) AS oldest "
               "FROM alert_delivery WHERE status = 'PENDING' GROUP BY target "
               "ORDER BY target")
_CLAIM_DELIVERY = sql(
    "UPDATE alert_delivery SET lease_token = :t, next_at = :now + :ms, "
    "attempts = attempts + 1 WHERE id = :id AND status = 'PENDING' AND next_at <= :now")
_DELIVERY = sql("SELECT id, delivery_id, alert_id, event, target, body, status, attempts, "
                "next_at, last_error, created_at, delivered_at FROM alert_delivery "
                "WHERE id = :id")
_DELIVERED = sql(
    "UPDATE alert_delivery SET status = 'DELIVERED', delivered_at = :now, "
    "lease_token = NULL, last_error = NULL WHERE id = :id AND lease_token = :t")
_RETRY = sql(
    "UPDATE alert_delivery SET next_at = :now + :ms, lease_token = NULL, last_error = :e "
    "WHERE id = :id AND lease_token = :t")
_FAILED = sql(
    "UPDATE alert_delivery SET status = 'FAILED', lease_token = NULL, last_error = :e "
    "WHERE id = :id AND lease_token = :t")
_OLD_RESOLVED = sql(
    "SELECT id FROM quality_alert WHERE status = 'RESOLVED' AND resolved_at <= :now - :age "
    "AND NOT EXISTS (SELECT 1 FROM alert_delivery d WHERE d.alert_id = quality_alert.id "
    "AND d.status = 'PENDING') ORDER BY id")
_DROP_SAMPLES = sql("DELETE FROM quality_alert_sample WHERE alert_id IN :ids", "ids")
_DROP_DELIVERIES = sql("DELETE FROM alert_delivery WHERE alert_id IN :ids", "ids")
_DROP_ALERTS = sql("DELETE FROM quality_alert WHERE id IN :ids AND status = 'RESOLVED'",
                   "ids")
#: Done deliveries of resolved alerts: those of an alert not resolved are who heard of
#: it, whom its next event (an update, its resolve, its first ack) goes to, however old.
_PRUNE_DELIVERIES = sql(
    "DELETE FROM alert_delivery WHERE status IN ('DELIVERED', 'FAILED') "
    "AND created_at <= :now - :age AND alert_id IN (SELECT a.id FROM quality_alert a "
    "WHERE a.status = 'RESOLVED')")
_DELIVERIES = sql("SELECT id, delivery_id, alert_id, event, target, status, attempts, "
                  "next_at, last_error, created_at, delivered_at FROM alert_delivery "
                  "WHERE alert_id = :id ORDER BY id")


class LeaseLost(Exception):
    """The role's lease is no longer ours: the transaction must write nothing."""


class AlertStore:
    """Alerts, their samples, the outbox and role leases on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- role lease ---------------------------------------------------------------------

    def claim_role(self, name: str, holder: str, token: str, lease_ms: int) -> bool:
        """Take (or renew) the role ``name`` for ``lease_ms`` if its lease ran out or is
        already held under ``token``."""
        def work(tx: Tx) -> bool:
            if tx.execute(_LEASE_ROW, {"n": name}).first() is None:
                # another process may make it at the same moment: that one stays
                tx.execute(self.store.dialect.insert_ignore(schema.role_lease),
                           [{"name": name, "lease_until": 0, "updated_at": tx.now}])
            return tx.execute(_LEASE_CLAIM, {"n": name, "h": holder[:64], "t": token,
                                             "ms": lease_ms}).rowcount == 1
        return self.store.transaction(work)

    @staticmethod
    def fence(tx: Tx, name: str, token: str, lease_ms: int) -> None:
        """Renew the role in ``tx`` (its row stays locked until ``tx`` ends), or raise
        :class:`LeaseLost` if ``token`` no longer holds it."""
        if tx.execute(_LEASE_RENEW, {"n": name, "t": token, "ms": lease_ms}).rowcount != 1:
            raise LeaseLost(name)

    def release_role(self, name: str, token: str) -> None:
        """Give the role up now (the next claim takes it at once)."""
        self.store.transaction(lambda tx: tx.execute(_LEASE_RELEASE, {"n": name, "t": token}))

    def role(self, name: str) -> dict[str, Any] | None:
        """The lease row of a role (holder, token, lease_until), or None."""
        with self.store.read() as tx:
            rows = tx.rows(_LEASE_GET, {"n": name})
        return rows[0] if rows else None

    # -- alerts ---------------------------------------------------------------------------

    @staticmethod
    def open_alerts(tx: Tx) -> list[dict[str, Any]]:
        return tx.rows(_OPEN_ALERTS)

    @staticmethod
    def last_resolved(tx: Tx, key: str) -> int | None:
        v = tx.execute(_LAST_RESOLVED, {"k": key}).scalar()
        return None if v is None else int(v)

    @staticmethod
    def has_key(tx: Tx, key: str) -> bool:
        """Whether an alert of this key was ever opened (open or resolved)."""
        return tx.execute(_KEY_SEEN, {"k": key}).first() is not None

    @staticmethod
    def newest_opened(tx: Tx, rule: str, prompt: str) -> int | None:
        """When the newest alert of ``rule`` on ``prompt`` was opened (ms), or None."""
        v = tx.execute(_NEWEST_OPENED, {"r": rule, "p": prompt}).scalar()
        return None if v is None else int(v)

    @staticmethod
    def insert_alert(tx: Tx, row: dict[str, Any]) -> int:
        """Insert an OPEN alert (``open_key`` = its key); IntegrityError if one of that
        key is open already."""
        values = {**row, "open_key": row["alert_key"], "status": OPEN, "opened_at": tx.now,
                  "updated_at": tx.now, "notified_at": tx.now, "version": 0}
        key = tx.execute(schema.quality_alert.insert().values(values)).inserted_primary_key
        assert key is not None
        return int(key[0])

    @staticmethod
    def update_alert(tx: Tx, alert_id: int, figures: dict[str, Any],
                     notified_at: int) -> bool:
        return tx.execute(_UPDATE, {"id": alert_id, "notified_at": notified_at,
                                    **figures}).rowcount == 1

    @staticmethod
    def resolve_alert(tx: Tx, alert_id: int,
                      figures: Mapping[str, Any] | None = None) -> bool:
        """Resolve an OPEN alert, writing ``figures`` (some of value, baseline,
        threshold, calls, window_s: those of the evaluation that cleared it) with it."""
        given = {k: v for k, v in (figures or {}).items() if k in _RESOLVE_FIGURES}
        text = "".join(f", {k} = :{k}" for k in sorted(given))
        return tx.execute(sql(_RESOLVE.format(figures=text)),
                          {"id": alert_id, **given}).rowcount == 1

    @staticmethod
    def alert_row(tx: Tx, alert_id: int) -> dict[str, Any]:
        return tx.one(_ALERT, {"id": alert_id}, missing=NotFound(
            f"no alert {alert_id}; list them with `lockgate alerts list --all`"))

    def alerts(self, *, everything: bool = False, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest ``limit`` open alerts (listed oldest first), or with
        ``everything`` the newest ``limit`` alerts, resolved ones too (newest first)."""
        with self.store.read() as tx:
            if everything:
                return tx.rows(_ALERTS, {"lim": limit})
            return list(reversed(tx.rows(_NEWEST_OPEN, {"lim": limit})))

    def alert(self, alert_id: int) -> tuple[dict[str, Any], list[dict[str, Any]],
                                            list[dict[str, Any]]]:
        """An alert, its samples (newest first) and its deliveries."""
        with self.store.read() as tx:
            row = self.alert_row(tx, alert_id)
            return row, tx.rows(_SAMPLES, {"id": alert_id}), \
                tx.rows(_DELIVERIES, {"id": alert_id})

    def ack(self, alert_id: int, by: str | None, reason: str | None,
            then: Callable[[Tx], object] | None = None) -> bool:
        """Acknowledge an alert (once: False if it was already); it goes on being
        updated and resolves as any other. ``then`` runs in the same transaction when
        the ack changed the alert (its webhooks are told so)."""
        def work(tx: Tx) -> bool:
            self.alert_row(tx, alert_id)
            done = tx.execute(_ACK, {"id": alert_id, "by": schema.audit_name(by) or None,
                                     "reason": reason}).rowcount == 1
            if done and then is not None:
                then(tx)
            return done
        return self.store.transaction(work)

    # -- samples and volume ---------------------------------------------------------------

    @staticmethod
    def sample_count(tx: Tx, alert_id: int) -> int:
        return int(tx.execute(_SAMPLE_COUNT, {"id": alert_id}).scalar_one())

    @staticmethod
    def sampled(tx: Tx, alert_id: int) -> set[int]:
        return {int(v) for v in tx.execute(_SAMPLE_IDS, {"id": alert_id}).scalars()}

    @staticmethod
    def candidates(tx: Tx, version: str | None, model: str | None, since: int, until: int,
                   limit: int, *, with_result: bool = False,
                   configs: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` attempts of a registry version (None: of inline prompts,
        of the tasks of ``configs`` if given) and model (None: every model) started in
        [since, until), light columns only (with the task's result if asked)."""
        if configs is not None and not configs:
            return []
        query = sql(_CANDIDATES.format(
            version=_version_cond(version, configs),
            result="t.result" if with_result else "NULL",
            model="" if model is None else "AND a.model = :model"),
            *(("cfg",) if configs is not None else ()))
        return tx.rows(query, {"v": version, "since": since, "until": until,
                               "model": model, "lim": limit,
                               **({"cfg": list(configs)} if configs is not None else {})})

    @staticmethod
    def ended(tx: Tx, version: str | None, model: str | None, since: int, until: int, *,
              configs: Sequence[str] | None = None) -> int:
        """Tasks ended by attempts of a registry version (None: of inline prompts, of
        the tasks of ``configs`` if given) and model (None: every model) started in
        [since, until), counted as the rollups count ``tasks`` (release-gate batches
        left out)."""
        if configs is not None and not configs:
            return 0
        query = sql(_ENDED.format(version=_version_cond(version, configs),
                                  model="" if model is None else "AND a.model = :model"),
                    *(("cfg",) if configs is not None else ()))
        return int(tx.execute(query, {
            "v": version, "since": since, "until": until, "model": model,
            "gate": f"{RESERVED_ID_PREFIX}%",
            **({"cfg": list(configs)} if configs is not None else {})}).scalar_one())

    @staticmethod
    def attempts(tx: Tx, ids: Sequence[int]) -> list[dict[str, Any]]:
        """Attempts by id with their task, prompt and raw output."""
        if not ids:
            return []
        return tx.rows(_HEAVY, {"ids": list(ids)})

    @staticmethod
    def add_samples(tx: Tx, alert_id: int, rows: Iterable[dict[str, Any]]) -> int:
        values = [{**r, "alert_id": alert_id, "created_at": tx.now} for r in rows]
        if values:
            tx.execute(schema.quality_alert_sample.insert(), values)
        return len(values)

    @staticmethod
    def touched(tx: Tx, version: str | None, model: str | None, since: int,
                limit: int, *, configs: Sequence[str] | None = None
                ) -> list[dict[str, Any]]:
        """(batch, config hash, version) of the newest ``limit`` attempts of a version
        (None: inline prompts, of the tasks of ``configs`` if given) and model (None:
        every model) since ``since``."""
        model_cond = "" if model is None else "AND a.model = :model"
        if configs is None:
            return tx.rows(sql(_TOUCHED.format(version=_version_cond(version, None),
                                               model=model_cond)),
                           {"v": version, "since": since, "model": model, "lim": limit})
        if not configs:
            return []
        return tx.rows(sql(_TOUCHED_CONFIGS.format(model=model_cond), "cfg"),
                       {"since": since, "model": model, "lim": limit,
                        "cfg": list(configs)})

    # -- outbox ---------------------------------------------------------------------------

    @staticmethod
    def enqueue(tx: Tx, alert_id: int, event: str, targets: Iterable[str],
                body_of: Callable[[str], bytes]) -> list[str]:
        """One PENDING delivery per target (``body_of(delivery_id)`` makes its body);
        returns the delivery ids."""
        rows: list[dict[str, Any]] = []
        ids: list[str] = []
        for target in targets:
            did = secrets.token_hex(16)
            data = body_of(did)
            ids.append(did)
            rows.append({"delivery_id": did, "alert_id": alert_id, "event": event,
                         "target": target[:100], "body": data.decode(),
                         "status": "PENDING", "attempts": 0, "next_at": tx.now,
                         "created_at": tx.now})
        if rows:
            tx.execute(schema.alert_delivery.insert(), rows)
        return ids

    def claim_deliveries(self, token: str, lease_ms: int, limit: int, *,
                         targets: Iterable[str],
                         room: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
        """Claim up to ``limit`` due deliveries to the webhooks named in ``targets`` (the
        sender's configuration) under ``token`` for ``lease_ms`` (a sender that dies
        leaves them to be claimed again once that has passed). A delivery to another
        webhook is not read: it stays PENDING for a sender that knows it.
        ``room``: how many more a webhook (by target) may have claimed now; those not
        named have ``limit``. A webhook with none left is not read at all."""
        room = dict(room or {})
        known = sorted({t for t in targets if room.get(t, limit) > 0})
        if not known:
            return []

        def work(tx: Tx) -> list[dict[str, Any]]:
            out = []
            left = dict(room)
            for did, target in tx.execute(_DUE, {"lim": limit, "known": known}).all():
                if left.get(target, limit) <= 0:
                    continue  # its share of this claim is taken: due at the next one
                if tx.execute(_CLAIM_DELIVERY, {"id": did, "t": token,
                                                "ms": lease_ms}).rowcount == 1:
                    out.append(tx.rows(_DELIVERY, {"id": did})[0])
                    left[target] = left.get(target, limit) - 1
            return out
        return self.store.transaction(work)

    def delivered(self, row_id: int, token: str) -> bool:
        return bool(self.store.transaction(lambda tx: tx.execute(
            _DELIVERED, {"id": row_id, "t": token}).rowcount))

    def retry_later(self, row_id: int, token: str, delay_ms: int, error: str) -> bool:
        return bool(self.store.transaction(lambda tx: tx.execute(
            _RETRY, {"id": row_id, "t": token, "ms": delay_ms, "e": error[:2000]}).rowcount))

    def failed(self, row_id: int, token: str, error: str) -> bool:
        return bool(self.store.transaction(lambda tx: tx.execute(
            _FAILED, {"id": row_id, "t": token, "e": error[:2000]}).rowcount))

    def prune_deliveries(self, older_than_ms: int) -> int:
        """Delete DELIVERED and FAILED deliveries older than that of resolved alerts
        (an alert's deliveries are the webhooks its next event goes to: those of an
        alert not resolved stay); how many went."""
        return int(self.store.transaction(lambda tx: tx.execute(
            _PRUNE_DELIVERIES, {"age": older_than_ms}).rowcount))

    def prune_alerts(self, older_than_ms: int) -> tuple[int, int]:
        """Delete alerts resolved more than ``older_than_ms`` ago whose webhooks have no
        delivery pending, with their samples and deliveries; (alerts, samples) gone."""
        def work(tx: Tx) -> tuple[int, int]:
            ids = [int(r[0]) for r in tx.execute(_OLD_RESOLVED, {"age": older_than_ms})]
            alerts = samples = 0
            for i in range(0, len(ids), 500):
                part = {"ids": ids[i:i + 500]}
                samples += tx.execute(_DROP_SAMPLES, part).rowcount
                tx.execute(_DROP_DELIVERIES, part)
                alerts += tx.execute(_DROP_ALERTS, part).rowcount
            return alerts, samples
        return self.store.transaction(work)

    def waiting(self) -> tuple[list[dict[str, Any]], int]:
        """Per webhook (target) with PENDING deliveries: ``target``, ``pending`` (how
        many) and ``oldest`` (the oldest's creation, ms); and the database clock."""
        with self.store.read() as tx:
            return [{"target": str(r["target"]), "pending": int(r["pending"]),
                     "oldest": int(r["oldest"])} for r in tx.rows(_WAITING)], tx.now

    def pending_deliveries(self) -> int:
        with self.store.read() as tx:
            return int(tx.execute(
                "SELECT COUNT(*) FROM alert_delivery WHERE status = 'PENDING'").scalar_one())
