"""Durable fabric state in SQLite: device flags, connections, tasks, fault knobs.

The inventory itself comes from the topology file; the database holds what
changes. The schema is created with ``CREATE TABLE IF NOT EXISTS`` and never
migrated: a new column means a new database. WAL journal with
``synchronous=FULL`` so a SIGKILL loses no committed row.

Concurrency: one writer. The service makes every call from its single worker
thread (``worker.py``), so a read-decide-write sequence there is atomic with
respect to other requests; multi-row writes also run in one transaction.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
  id TEXT PRIMARY KEY,
  health TEXT NOT NULL DEFAULT 'OK',
  in_use INTEGER NOT NULL DEFAULT 0,
  foreign_owner TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS connections (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  device TEXT NOT NULL UNIQUE,
  initiator TEXT NOT NULL,
  state TEXT NOT NULL,            -- Attaching | Attached | Detaching | Failed
  bdf TEXT NOT NULL DEFAULT '',   -- planned before hot-add, so a resumed task is idempotent
  created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL,             -- attach | detach
  connection INTEGER NOT NULL,
  device TEXT NOT NULL,
  initiator TEXT NOT NULL,
  state TEXT NOT NULL,            -- New | Running | Completed | Exception
  fail INTEGER NOT NULL DEFAULT 0,
  message TEXT NOT NULL DEFAULT '',
  started REAL NOT NULL,
  ended REAL
);
CREATE TABLE IF NOT EXISTS knobs (key TEXT PRIMARY KEY, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS attach_requests (  -- the test-only audit (GET /patchbay/v1/audit)
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  target TEXT NOT NULL,
  initiator TEXT NOT NULL,        -- "<node>/<adapter>"
  dialect TEXT NOT NULL,          -- connections | zones
  at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS answers (  -- first answer per Idempotency-Key (idempotency.py)
  scope TEXT PRIMARY KEY,         -- "<method> <path> <key>"
  digest TEXT NOT NULL,           -- sha256 of the request body
  status INTEGER NOT NULL,
  location TEXT NOT NULL,
  body TEXT NOT NULL
);
"""

OPEN_STATES = ("New", "Running")
FAILED = "Failed"  # a connection whose task failed half-way (outcomes.py): it holds nothing
KNOBS = ("fail_attaches", "fail_detaches", "attach_latency", "detach_latency")


@dataclass(frozen=True)
class AttachRequest:
    target: str
    initiator: str  # "<node>/<adapter>"
    dialect: str  # connections | zones
    at: float


@dataclass(frozen=True)
class Answer:
    digest: str
    status: int
    location: str
    body: str


@dataclass(frozen=True)
class DeviceState:
    id: str
    health: str
    in_use: bool
    foreign_owner: str


@dataclass(frozen=True)
class Connection:
    id: int
    device: str
    initiator: str
    state: str
    bdf: str
    created: float


@dataclass(frozen=True)
class Task:
    id: int
    kind: str
    connection: int
    device: str
    initiator: str
    state: str
    fail: bool
    message: str
    started: float
    ended: float | None

    @property
    def done(self) -> bool:
        return self.state not in OPEN_STATES


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ---- devices -------------------------------------------------------------

    def ensure_devices(self, ids: list[str]) -> None:
        with self.db:
            self.db.executemany("INSERT OR IGNORE INTO devices(id) VALUES (?)", [(i,) for i in ids])

    def device(self, ident: str) -> DeviceState:
        row = self.db.execute("SELECT * FROM devices WHERE id=?", (ident,)).fetchone()
        if row is None:
            return DeviceState(ident, "OK", False, "")
        return DeviceState(row[0], row[1], bool(row[2]), row[3])

    def set_device(
        self,
        ident: str,
        health: str | None = None,
        in_use: bool | None = None,
        foreign_owner: str | None = None,
    ) -> DeviceState:
        cur = self.device(ident)
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO devices VALUES (?,?,?,?)",
                (
                    ident,
                    cur.health if health is None else health,
                    int(cur.in_use if in_use is None else in_use),
                    cur.foreign_owner if foreign_owner is None else foreign_owner,
                ),
            )
        return self.device(ident)

    # ---- connections -----------------------------------------------------------

    def connections(self) -> list[Connection]:
        return [Connection(*r) for r in self.db.execute("SELECT * FROM connections ORDER BY id")]

    def connection(self, ident: int) -> Connection | None:
        row = self.db.execute("SELECT * FROM connections WHERE id=?", (ident,)).fetchone()
        return Connection(*row) if row else None

    def connection_of(self, device: str) -> Connection | None:
        row = self.db.execute("SELECT * FROM connections WHERE device=?", (device,)).fetchone()
        return Connection(*row) if row else None

    def set_connection(self, ident: int, state: str | None = None, bdf: str | None = None) -> None:
        with self.db:
            if state is not None:
                self.db.execute("UPDATE connections SET state=? WHERE id=?", (state, ident))
            if bdf is not None:
                self.db.execute("UPDATE connections SET bdf=? WHERE id=?", (bdf, ident))

    def delete_connection(self, ident: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM connections WHERE id=?", (ident,))

    # ---- tasks ---------------------------------------------------------------------

    def _task_row(self, where: str, args: tuple[object, ...]) -> list[Task]:
        rows = self.db.execute(f"SELECT * FROM tasks {where} ORDER BY id", args).fetchall()
        return [Task(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), *r[7:]) for r in rows]

    def task(self, ident: int) -> Task | None:
        rows = self._task_row("WHERE id=?", (ident,))
        return rows[0] if rows else None

    def tasks(self) -> list[Task]:
        return self._task_row("", ())

    def open_tasks(self) -> list[Task]:
        return self._task_row("WHERE state IN (?,?)", OPEN_STATES)

    def open_task_of(self, connection: int) -> Task | None:
        rows = self._task_row("WHERE connection=? AND state IN (?,?)", (connection, *OPEN_STATES))
        return rows[-1] if rows else None

    def start_attach(self, device: str, initiator: str, fail: bool) -> tuple[Connection, Task]:
        """Insert the connection (Attaching) and its task (New) in one transaction."""
        now = time.time()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO connections(device, initiator, state, created) VALUES (?,?,?,?)",
                (device, initiator, "Attaching", now),
            )
            conn_id = int(cur.lastrowid or 0)
            task_id = self._insert_task("attach", conn_id, device, initiator, fail, now)
        conn, task = self.connection(conn_id), self.task(task_id)
        assert conn is not None and task is not None
        return conn, task

    def start_detach(self, conn: Connection, fail: bool) -> Task:
        now = time.time()
        with self.db:
            self.db.execute("UPDATE connections SET state='Detaching' WHERE id=?", (conn.id,))
            task_id = self._insert_task("detach", conn.id, conn.device, conn.initiator, fail, now)
        task = self.task(task_id)
        assert task is not None
        return task

    def _insert_task(
        self, kind: str, conn: int, device: str, initiator: str, fail: bool, now: float
    ) -> int:
        cur = self.db.execute(
            "INSERT INTO tasks(kind, connection, device, initiator, state, fail, started)"
            " VALUES (?,?,?,?,?,?,?)",
            (kind, conn, device, initiator, "New", int(fail), now),
        )
        return int(cur.lastrowid or 0)

    def set_task(self, ident: int, state: str, message: str = "") -> None:
        ended = None if state in OPEN_STATES else time.time()
        with self.db:
            self.db.execute(
                "UPDATE tasks SET state=?, message=?, ended=? WHERE id=?",
                (state, message, ended, ident),
            )

    # ---- fault knobs --------------------------------------------------------------

    def knob(self, key: str, default: float = 0.0) -> float:
        row = self.db.execute("SELECT value FROM knobs WHERE key=?", (key,)).fetchone()
        return float(row[0]) if row else default

    def set_knob(self, key: str, value: float) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO knobs VALUES (?,?)", (key, value))

    def take(self, key: str) -> bool:
        """Consume one unit of a counter knob (``fail_attaches``); True if one was left."""
        left = self.knob(key)
        if left < 1:
            return False
        self.set_knob(key, left - 1)
        return True

    # ---- the attach-request audit and remembered answers ----------------------------

    def record_attach_request(self, target: str, initiator: str, dialect: str) -> None:
        with self.db:
            self.db.execute(
                "INSERT INTO attach_requests(target, initiator, dialect, at) VALUES (?,?,?,?)",
                (target, initiator, dialect, time.time()),
            )

    def attach_requests(self) -> list[AttachRequest]:
        rows = self.db.execute("SELECT target, initiator, dialect, at FROM attach_requests")
        return [AttachRequest(*r) for r in rows]

    def answer(self, scope: str) -> Answer | None:
        row = self.db.execute(
            "SELECT digest, status, location, body FROM answers WHERE scope=?", (scope,)
        ).fetchone()
        return Answer(*row) if row else None

    def remember_answer(self, scope: str, answer: Answer) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR IGNORE INTO answers VALUES (?,?,?,?,?)",
                (scope, answer.digest, answer.status, answer.location, answer.body),
            )
