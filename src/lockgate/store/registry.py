"""Registry persistence: prompts, immutable versions, labels, the audit trail, datasets.

Every change of what a prompt name resolves to (the live version, a label) is a
conditional UPDATE with its row count checked, and bumps ``prompt.generation`` when
the live pointer moves, so workers notice a change with one primary-key read and the
release gate can compare-and-swap on it. Version and dataset-item rows are never
updated: a changed item is a new row, and the row it replaces is *retired* at the
dataset revision that replaced it, so every past revision can be read back exactly.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.exc import IntegrityError

from lockgate.errors import NotFound, SpecError, StateConflict
from lockgate.spec import canonical_json
from lockgate.store import schema
from lockgate.store.store import Store
from lockgate.store.tx import Tx, sql

#: Audit actions that set the live pointer (the live history); ``promote`` is an A/B
#: test's (:mod:`lockgate.store.experiments`).
LIVE_ACTIONS = ("create", "activate", "rollback", "promote")
PRODUCTION = "production"

# The statements, the same on every dialect. Inserts go through the schema's tables
# (``inserted_id``, ``Dialect.insert_ignore``); a statement that row-locks adds the
# dialect's ``lock_for_update()`` suffix (see ``RegistryStore.__init__``).

# -- prompts and where they point
_PROMPT = sql("SELECT id, name, live_version, generation, submissions, description, "
              "created_at, updated_at FROM prompt WHERE name = :n")
_PROMPTS = sql("SELECT name, live_version, generation, submissions, updated_at "
               "FROM prompt ORDER BY name")
_LIVE_POINTER = sql("SELECT live_version, generation FROM prompt WHERE name = :n")
_LABEL_POINTER = sql("SELECT l.version, p.generation FROM prompt p LEFT JOIN prompt_label l "
                     "ON l.prompt_id = p.id AND l.label = :l WHERE p.name = :n")
_SWAP_LIVE = sql("UPDATE prompt SET live_version = :to, generation = generation + 1, "
                 "updated_at = :now WHERE id = :p AND generation = :g")

# -- versions (immutable but for a tag given once)
_VERSION_COLUMNS = ("SELECT version, template, model_config, delivery_rule, content_hash, "
                    "tag, author, note, created_at FROM prompt_version WHERE prompt_id = :p")
_VERSION = sql(_VERSION_COLUMNS + " AND version = :v")
_VERSION_BY_TAG = sql(_VERSION_COLUMNS + " AND tag = :t")
_VERSIONS = sql(_VERSION_COLUMNS + " ORDER BY version")
_VERSION_OF_CONTENT = sql("SELECT version, tag FROM prompt_version "
                          "WHERE prompt_id = :p AND content_hash = :h")
_VERSION_TAGGED = sql("SELECT version FROM prompt_version WHERE prompt_id = :p AND tag = :t")
_TAG_VERSION = sql("UPDATE prompt_version SET tag = :t "
                   "WHERE prompt_id = :p AND version = :v AND tag IS NULL")
_LAST_VERSION = sql("SELECT MAX(version) FROM prompt_version WHERE prompt_id = :p")

# -- labels and the audit trail
_LABELS = sql("SELECT label, version FROM prompt_label WHERE prompt_id = :p ORDER BY label")
_LABEL = sql("SELECT version FROM prompt_label WHERE prompt_id = :p AND label = :l")
_MOVE_LABEL = sql("UPDATE prompt_label SET version = :v, updated_by = :a, updated_at = :now "
                  "WHERE prompt_id = :p AND label = :l")
_AUDIT_TRAIL = sql("SELECT id, action, from_version, to_version, label, update_id, "
                   "generation, actor, reason, created_at FROM prompt_audit "
                   "WHERE prompt_id = :p ORDER BY id")
_LIVE_HISTORY = sql("SELECT action, from_version, to_version FROM prompt_audit "
                    "WHERE prompt_id = :p AND action IN :acts ORDER BY id", "acts")

# -- datasets and their revisions
_DATASET = sql("SELECT id, name, description, source, revision, item_count, items_hash, "
               "input_keys, created_at, updated_at FROM dataset WHERE name = :n")
_DATASETS = sql("SELECT name, revision, item_count, items_hash, updated_at FROM dataset "
                "ORDER BY name")
_DATASET_REVISION = sql("SELECT id, revision FROM dataset WHERE name = :n")
_SET_REVISION = sql("UPDATE dataset SET revision = :rev, item_count = :n, items_hash = :h, "
                    "input_keys = :k, updated_at = :now, source = COALESCE(:src, source), "
                    "description = COALESCE(:desc, description) WHERE id = :d")
_ACTIVE_ITEMS = sql("SELECT id, item_key, content_hash FROM dataset_item "
                    "WHERE dataset_id = :d AND retired_rev IS NULL")
_ACTIVE_CONTENT = sql("SELECT item_key, content_hash, input_data FROM dataset_item "
                      "WHERE dataset_id = :d AND retired_rev IS NULL ORDER BY id")
_RETIRE_ITEMS = sql("UPDATE dataset_item SET retired_rev = :rev WHERE id IN :ids "
                    "AND retired_rev IS NULL", "ids")
_ITEMS_AT = sql("SELECT id, item_key, content_hash, input_data, expected FROM dataset_item "
                "WHERE dataset_id = :d AND added_rev <= :rev AND (retired_rev IS NULL OR "
                "retired_rev > :rev) ORDER BY id")
_ITEMS_AT_LIMIT = sql(_ITEMS_AT.text + " LIMIT :lim")


def inserted_id(result: Any) -> int:
    """The primary key a single-row INSERT created (every dialect reports it)."""
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def dumps(value: Any) -> str:
    """Canonical JSON text (sorted keys): equal content, equal bytes."""
    return canonical_json(value).decode()


@dataclass(frozen=True, slots=True)
class VersionContent:
    """What a prompt version holds; ``content_hash`` is computed by the caller."""

    template: Any
    model_config: dict[str, Any]
    delivery_rule: dict[str, Any]
    content_hash: str


@dataclass(frozen=True, slots=True)
class VersionRow:
    """One immutable prompt version."""

    prompt: str
    version: int
    template: Any
    model_config: dict[str, Any]
    delivery_rule: dict[str, Any]
    content_hash: str
    tag: str | None
    author: str | None
    note: str | None
    created_at: int

    @property
    def ref(self) -> str:
        """``name@N``: how traces and snapshots name this version."""
        return f"{self.prompt}@{self.version}"


@dataclass(frozen=True, slots=True)
class DatasetItem:
    """One labelled sample as given: key, input fields, expected output."""

    key: str
    input: dict[str, Any]
    expected: Any
    #: Where the item was read (its file line, or its place in a list), for errors.
    line: int | None = field(default=None, compare=False)
    #: Whether ``key`` was derived from the input (the item gave no id).
    derived_key: bool = field(default=False, compare=False)
    #: Keys of the line beside ``input`` that are none of its fields (not stored).
    ignored: tuple[str, ...] = field(default=(), compare=False)

    @property
    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of (input, expected)."""
        return hashlib.sha256(canonical_json(
            {"input": self.input, "expected": self.expected})).hexdigest()


def items_hash(pairs: Sequence[tuple[str, str]]) -> str:
    """The content address of a dataset revision: its (key, content hash) pairs in order."""
    h = hashlib.sha256()
    for key, content in pairs:
        h.update(key.encode())
        h.update(b"\x00")
        h.update(content.encode())
        h.update(b"\n")
    return h.hexdigest()


def check_unique(items: Sequence[DatasetItem]) -> None:
    """StateConflict naming the first id that several items share and where they are
    (one pass with a Counter: counting each key in the list was quadratic)."""
    counts = Counter(i.key for i in items)
    if len(counts) == len(items):
        return
    dups = [k for k, n in counts.items() if n > 1]  # in the order they first appear
    key = dups[0]
    at = [(n, it) for n, it in enumerate(items, start=1) if it.key == key]
    on_lines = all(it.line is not None for _n, it in at)
    places = [str(it.line if on_lines else n) for n, it in at]
    shown = ", ".join(places[:-1][:9]) + (", …" if len(places) > 10 else "")
    times = "twice" if len(places) == 2 else f"{len(places)} times"
    text = (f"item id '{key}' appears {times} in the input "
            f"({'lines' if on_lines else 'items'} {shown} and {places[-1]})")
    if any(it.derived_key for _n, it in at):
        text += (": the id is derived from the input, as the items give none, so these "
                 "items have the same input; give each an 'id', or drop the repeats")
    else:
        text += ": item ids must be unique; rename or drop the repeats"
    if len(dups) > 1:
        text += f" ({len(dups) - 1} more id(s) repeat too)"
    raise StateConflict(text)


def _encoded(item: DatasetItem, position: int, limit: int) -> tuple[str, str]:
    """(input, expected) as stored JSON text; SpecError naming the item when together
    they exceed ``limit`` bytes: the bound a submit puts on a task's input
    (:meth:`Store.max_input_bytes`), which an evaluation makes of the item.

    A value JSON cannot encode is refused here too, naming its line and field: nested
    deeper than the encoder goes (a JSONL line may hold up to 1,024 levels), or, from
    Python, a type or an integer JSON has no place for. Each field is encoded one level
    down, as :attr:`DatasetItem.content_hash` nests it, so that the hash cannot fail
    later on a field at the very limit."""
    where = "" if item.line is not None else f"item {position}: "
    fields: list[bytes] = []
    for name, value in (("input", item.input), ("expected", item.expected)):
        try:
            fields.append(canonical_json([value])[1:-1])
        except (TypeError, orjson.JSONEncodeError) as exc:
            why = ("is nested too deeply (more than 250 levels): flatten it, or give the "
                   "deep part as a JSON string" if "Recursion" in str(exc)
                   else f"cannot be encoded as JSON ({exc})")
            raise SpecError(f"{where}item '{item.key}' {why}", field=name,
                            line=item.line) from None
    input_data, expected = fields
    size = len(input_data) + len(expected)
    if size > limit:
        raise SpecError(f"{where}item '{item.key}' is {size:,} bytes as JSON (input and "
                        f"expected); this database takes at most {limit:,} bytes per item "
                        "(its bound on a task's input): split it, or store the content "
                        "elsewhere and pass a reference", line=item.line)
    return input_data.decode(), expected.decode()


def _version_row(name: str, r: Mapping[str, Any]) -> VersionRow:
    return VersionRow(prompt=name, version=int(r["version"]),
                      template=orjson.loads(r["template"]),
                      model_config=orjson.loads(r["model_config"]),
                      delivery_rule=orjson.loads(r["delivery_rule"]),
                      content_hash=r["content_hash"], tag=r["tag"], author=r["author"],
                      note=r["note"], created_at=int(r["created_at"]))


def prompt_exists(name: str) -> StateConflict:
    """The refusal of a prompt created again."""
    return StateConflict(f"prompt '{name}' already exists; change it with `lockgate prompt "
                         "propose`")


class RegistryStore:
    """Prompts, versions, labels, audit trail and datasets on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dialect = store.dialect
        lock = self.dialect.lock_for_update()
        self._prompt_locked = sql(_PROMPT.text + lock)
        self._dataset_locked = sql(_DATASET_REVISION.text + lock)

    # -- prompts ------------------------------------------------------------------------

    def prompt_row(self, tx: Tx, name: str, *, lock: bool = False) -> dict[str, Any]:
        """The prompt row of ``name`` (row-locked with ``lock``); NotFound otherwise."""
        return tx.one(self._prompt_locked if lock else _PROMPT, {"n": name},
                      missing=NotFound(f"no prompt '{name}'; create it with "
                                       "`lockgate prompt create`"))

    def create_prompt(self, name: str, content: VersionContent, *, tag: str | None,
                      author: str | None, note: str | None,
                      description: str | None) -> VersionRow:
        """A new prompt whose version 1 is live at once (generation 1)."""

        def work(tx: Tx) -> VersionRow:
            now = tx.now
            try:
                pid = inserted_id(tx.execute(schema.prompt.insert().values(
                    name=name, live_version=1, generation=1, submissions=0,
                    description=description, created_at=now, updated_at=now)))
            except IntegrityError:
                raise prompt_exists(name) from None
            version, _ = self.add_version(tx, int(pid), content, tag=tag, author=author,
                                          note=note, now=now)
            self.audit(tx, int(pid), "create", None, version, generation=1, actor=author,
                       reason=note, now=now)
            return self.version_row(tx, name, int(pid), version)

        return self.store.transaction(work)

    def add_version(self, tx: Tx, prompt_id: int, content: VersionContent, *,
                    tag: str | None, author: str | None, note: str | None,
                    now: int) -> tuple[int, bool]:
        """The version number holding ``content``: an existing one with the same content
        hash, else a new row (the caller holds the prompt row's lock). Returns
        (version, created)."""
        found = tx.execute(_VERSION_OF_CONTENT,
                           {"p": prompt_id, "h": content.content_hash}).first()
        if found is not None:
            if tag is not None and found.tag not in (None, tag):
                raise StateConflict(f"this content is already version {found.version} "
                                    f"tagged '{found.tag}'; versions are immutable")
            if tag is not None and found.tag is None:
                self._check_tag_free(tx, prompt_id, tag)
                tx.execute(_TAG_VERSION, {"t": tag, "p": prompt_id, "v": found.version})
            return int(found.version), False
        if tag is not None:
            self._check_tag_free(tx, prompt_id, tag)
        last = tx.execute(_LAST_VERSION, {"p": prompt_id}).scalar()
        number = int(last or 0) + 1
        tx.execute(schema.prompt_version.insert().values(
            prompt_id=prompt_id, version=number, template=dumps(content.template),
            model_config=dumps(content.model_config),
            delivery_rule=dumps(content.delivery_rule), content_hash=content.content_hash,
            tag=tag, author=schema.audit_name(author), note=note, created_at=now))
        return number, True

    def _check_tag_free(self, tx: Tx, prompt_id: int, tag: str) -> None:
        """StateConflict when another version has the tag, or a label has its name: a
        selector (``prompt show --version``, ``prompt diff``) reads a label first, so
        the tagged version could never be selected by its tag."""
        other = tx.execute(_VERSION_TAGGED, {"p": prompt_id, "t": tag}).scalar()
        if other is not None:
            raise StateConflict(f"tag '{tag}' already names version {other}")
        labelled = tx.execute(_LABEL, {"p": prompt_id, "l": tag}).scalar()
        if labelled is not None:
            raise StateConflict(f"--tag '{tag}' is the name of a label (pointing at version "
                                f"{labelled}), which a version selector reads first, so "
                                "this tag could never select its version: choose another "
                                "tag")

    def audit(self, tx: Tx, prompt_id: int, action: str, from_version: int | None,
              to_version: int | None, *, generation: int, actor: str | None,
              reason: str | None, now: int, label: str | None = None,
              update_id: int | None = None) -> None:
        """Append one row to the audit trail (who, when, from, to, why)."""
        tx.execute(schema.prompt_audit.insert().values(
            prompt_id=prompt_id, action=action, from_version=from_version,
            to_version=to_version, label=label, update_id=update_id, generation=generation,
            actor=schema.audit_name(actor), reason=reason, created_at=now))

    def version_row(self, tx: Tx, name: str, prompt_id: int, version: int) -> VersionRow:
        """Version ``version`` of prompt ``name`` (id ``prompt_id``); NotFound naming
        the command that lists them when there is none."""
        return _version_row(name, tx.one(
            _VERSION, {"p": prompt_id, "v": version},
            missing=NotFound(f"prompt '{name}' has no version {version}; "
                             f"`lockgate prompt history {name}` lists them")))

    def prompt(self, name: str) -> dict[str, Any]:
        """The prompt row with its labels."""
        with self.store.read() as tx:
            out = self.prompt_row(tx, name)
            out["labels"] = {r.label: int(r.version)
                             for r in tx.execute(_LABELS, {"p": out["id"]})}
        return out

    def prompts(self) -> list[dict[str, Any]]:
        """Every prompt with its live version and generation."""
        with self.store.read() as tx:
            return tx.rows(_PROMPTS)

    def version(self, name: str, version: int) -> VersionRow:
        """One version of a prompt."""
        with self.store.read() as tx:
            row = self.prompt_row(tx, name)
            return self.version_row(tx, name, int(row["id"]), version)

    def version_by_tag(self, name: str, tag: str) -> VersionRow:
        """The version a tag names."""
        with self.store.read() as tx:
            row = self.prompt_row(tx, name)
            return _version_row(name, tx.one(
                _VERSION_BY_TAG, {"p": row["id"], "t": tag},
                missing=NotFound(f"prompt '{name}' has no version tagged '{tag}'")))

    def versions(self, name: str) -> list[VersionRow]:
        """Every version of a prompt, oldest first."""
        with self.store.read() as tx:
            row = self.prompt_row(tx, name)
            return [_version_row(name, r) for r in tx.rows(_VERSIONS, {"p": row["id"]})]

    def audit_trail(self, name: str) -> list[dict[str, Any]]:
        """The prompt's audit rows, oldest first."""
        with self.store.read() as tx:
            row = self.prompt_row(tx, name)
            return tx.rows(_AUDIT_TRAIL, {"p": row["id"]})

    def pointer(self, name: str, label: str | None) -> tuple[int | None, int]:
        """(version the name or label points at, generation): the workers' cheap check,
        one primary-key or unique-index read."""
        missing = NotFound(f"no prompt '{name}'")
        with self.store.read() as tx:
            if label is None or label == PRODUCTION:
                row = tx.one(_LIVE_POINTER, {"n": name}, missing=missing)
                live = row["live_version"]
                return (None if live is None else int(live)), int(row["generation"])
            row = tx.one(_LABEL_POINTER, {"n": name, "l": label}, missing=missing)
            if row["version"] is None:
                raise NotFound(f"prompt '{name}' has no label '{label}'")
            return int(row["version"]), int(row["generation"])

    def set_label(self, name: str, label: str, version: int, *, actor: str | None,
                  reason: str | None) -> int | None:
        """Point a custom label at a version; returns the version it pointed at before."""
        if label == PRODUCTION:
            raise StateConflict("'production' is the live version: it moves only through "
                                "the release gate or `lockgate prompt rollback`")
        actor = schema.audit_name(actor)

        def work(tx: Tx) -> int | None:
            now = tx.now
            p = self.prompt_row(tx, name, lock=True)
            pid = int(p["id"])
            self.version_row(tx, name, pid, version)
            tagged = tx.execute(_VERSION_TAGGED, {"p": pid, "t": label}).scalar()
            if tagged is not None:
                # A selector reads a label first: version ``tagged`` could no longer be
                # selected by its tag.
                raise StateConflict(f"label '{label}' is the tag of version {tagged} of "
                                    f"'{name}', which a version selector would no longer "
                                    "find by its tag: choose another label name")
            before = tx.execute(_LABEL, {"p": pid, "l": label}).scalar()
            tx.execute(self.dialect.insert_ignore(schema.prompt_label), [{
                "prompt_id": pid, "label": label, "version": version, "updated_by": actor,
                "updated_at": now}])
            tx.execute(_MOVE_LABEL, {"v": version, "a": actor, "p": pid, "l": label})
            self.audit(tx, pid, "label", before, version, generation=int(p["generation"]),
                       actor=actor, reason=reason, now=now, label=label)
            return None if before is None else int(before)

        return self.store.transaction(work)

    def rollback(self, name: str, to: int | None, *, actor: str | None,
                 reason: str | None) -> dict[str, Any]:
        """Compare-and-swap the live pointer back to a version that was live before.

        Without ``to``, the target is the version that was live before the last change
        of the live pointer. No evaluation runs: the target already passed the gate (or
        was the initial version). Returns from, to and the new generation.
        """
        actor = schema.audit_name(actor)

        def work(tx: Tx) -> dict[str, Any]:
            now = tx.now
            p = self.prompt_row(tx, name, lock=True)
            pid, live = int(p["id"]), p["live_version"]
            history = tx.execute(_LIVE_HISTORY, {"p": pid, "acts": list(LIVE_ACTIONS)}).all()
            good = {int(h.to_version) for h in history if h.to_version is not None}
            target = to
            if target is None:
                last = history[-1] if history else None
                if last is None or last.from_version is None:
                    raise StateConflict(f"prompt '{name}' has no earlier live version to "
                                        "roll back to")
                target = int(last.from_version)
            if target == live:
                raise StateConflict(f"version {target} of '{name}' is already live")
            if target not in good:
                raise StateConflict(
                    f"version {target} of '{name}' was never live (passed the gate); "
                    f"rollback targets: {sorted(good)}")
            generation = self.move_live(tx, p, target, "rollback", actor=actor,
                                        reason=reason, now=now)
            return {"prompt": name, "from": live, "to": target,
                    "generation": generation, "at": now}

        return self.store.transaction(work)

    def move_live(self, tx: Tx, p: Mapping[str, Any], to: int, action: str, *,
                  actor: str | None, reason: str | None, now: int) -> int:
        """Compare-and-swap the live pointer of the locked prompt row ``p`` to version
        ``to`` and audit it as ``action`` (one of :data:`LIVE_ACTIONS`, so that a
        rollback can undo it); returns the new generation."""
        generation = int(p["generation"])
        n = tx.execute(_SWAP_LIVE, {"to": to, "p": p["id"], "g": generation}).rowcount
        if n != 1:
            raise StateConflict(f"prompt '{p['name']}' changed during the {action}; retry")
        self.audit(tx, int(p["id"]), action, p["live_version"], to,
                   generation=generation + 1, actor=actor, reason=reason, now=now)
        return generation + 1

    # -- datasets -------------------------------------------------------------------------

    def add_items(self, name: str, items: Sequence[DatasetItem], *, replace: bool,
                  source: str | None, description: str | None) -> dict[str, Any]:
        """Add (or, with ``replace``, set) the items of a dataset as one new revision.

        An item whose key and content already exist is left alone; a key with new
        content retires the old row; with ``replace``, keys absent from ``items`` are
        retired too. The revision's (key, content hash) list is hashed into
        ``dataset.items_hash``, which evaluation snapshots freeze.
        """
        keys = [i.key for i in items]
        check_unique(items)
        # Encoded once, and measured before anything is written: a row past the server's
        # packet limit (MariaDB) would otherwise fail mid-insert, reported as a lost
        # connection.
        limit = self.store.max_input_bytes()
        encoded = [_encoded(it, n, limit) for n, it in enumerate(items, start=1)]
        source = schema.source_path(source)

        def work(tx: Tx) -> dict[str, Any]:
            now = tx.now
            d = schema.dataset
            tx.execute(self.dialect.insert_ignore(d), [{
                "name": name, "description": description, "source": source, "revision": 0,
                "item_count": 0, "items_hash": items_hash([]), "input_keys": "[]",
                "created_at": now, "updated_at": now}])
            row = tx.execute(self._dataset_locked, {"n": name}).one()
            did, rev = int(row.id), int(row.revision) + 1
            active = {r.item_key: (int(r.id), r.content_hash)
                      for r in tx.execute(_ACTIVE_ITEMS, {"d": did})}
            new_rows: list[dict[str, Any]] = []
            retire: list[int] = []
            unchanged = 0
            for it, (input_data, expected) in zip(items, encoded, strict=True):
                h = it.content_hash
                old = active.get(it.key)
                if old is not None and old[1] == h:
                    unchanged += 1
                    continue
                if old is not None:
                    retire.append(old[0])
                new_rows.append({"dataset_id": did, "item_key": it.key, "content_hash": h,
                                 "input_data": input_data, "expected": expected,
                                 "added_rev": rev, "retired_rev": None, "created_at": now})
            if replace:
                given = set(keys)
                retire += [pk for k, (pk, _h) in active.items() if k not in given]
            if not new_rows and not retire:
                return {"dataset": name, "revision": rev - 1, "added": 0, "changed": 0,
                        "retired": 0, "unchanged": unchanged,
                        "items": len(active)}
            changed = sum(1 for r in new_rows if r["item_key"] in active)
            for i in range(0, len(retire), 1000):
                tx.execute(_RETIRE_ITEMS, {"rev": rev, "ids": retire[i:i + 1000]})
            for i in range(0, len(new_rows), 500):
                tx.execute(schema.dataset_item.insert(), new_rows[i:i + 500])
            pairs = tx.execute(_ACTIVE_CONTENT, {"d": did}).all()
            input_keys: set[str] = set()
            for p in pairs:
                input_keys.update(orjson.loads(p.input_data))
            tx.execute(_SET_REVISION, {
                "rev": rev, "n": len(pairs), "h": items_hash([(p[0], p[1]) for p in pairs]),
                "k": dumps(sorted(input_keys)), "src": source, "desc": description, "d": did})
            return {"dataset": name, "revision": rev, "added": len(new_rows) - changed,
                    "changed": changed, "retired": len(retire) - changed,
                    "unchanged": unchanged, "items": len(pairs)}

        return self.store.transaction(work)

    def dataset(self, name: str) -> dict[str, Any]:
        """The dataset row (revision, item count, items hash, input keys)."""
        with self.store.read() as tx:
            return tx.one(_DATASET, {"n": name}, json=("input_keys",), missing=NotFound(
                f"no dataset '{name}'; add one with `lockgate dataset add`"))

    def datasets(self) -> list[dict[str, Any]]:
        """Every dataset with its revision and size."""
        with self.store.read() as tx:
            return tx.rows(_DATASETS)

    def items(self, name: str, *, revision: int | None = None,
              limit: int | None = None) -> list[dict[str, Any]]:
        """The items of a revision (default: the current one), in insertion order."""
        ds = self.dataset(name)
        rev = ds["revision"] if revision is None else revision
        statement, params = _ITEMS_AT, {"d": ds["id"], "rev": rev}
        if limit is not None:
            statement, params["lim"] = _ITEMS_AT_LIMIT, limit
        with self.store.read() as tx:
            return [{"id": r.item_key, "pk": int(r.id), "content_hash": r.content_hash,
                     "input": orjson.loads(r.input_data), "expected": orjson.loads(r.expected)}
                    for r in tx.execute(statement, params)]

