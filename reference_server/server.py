"""Assembly: store + engine + handler + HTTP shell + poll path + background scheduler.

``Server`` is what ``python -m reference_server`` runs and what in-process tests build. It owns the parts
and provides the small interfaces of :mod:`reference_server.ports` to the route groups of
:mod:`reference_server.routes`, which it registers; it holds no protocol logic of its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from suite.protocol import capabilities as caps

from . import cancellation, sessions
from .activities import TIMEOUT_WATCHES, enforce_activity_timeouts
from .app import CONTROL, OPEN, WORKER, App
from .clock import Clock, ServerClock, SystemClock
from .closing import CLEANUP_DEADLINE_WATCHES, enforce_cancellation_deadlines
from .commands import IMPLEMENTED_OPTIONAL_COMMANDS
from .config import Settings
from .http import HttpServer, Request, Response
from .hub import Hub
from .observers import JsonLinesEventLog, ObserverSet
from .polling import Poller
from .queries import DEADLINE_WATCHES, sweep_query_tasks
from .routes import open as open_routes
from .routes.control import cancellation as cancellation_requests
from .routes.control import messages, task_queues, test_clock, workflows
from .routes.control import worker_sessions as session_visibility
from .routes.worker import activity_tasks, query_tasks, registrations, workflow_tasks
from .routes.worker import cancellation as cooperative
from .routes.worker import sessions as worker_sessions
from .scheduler import Scheduler
from .store import Store, new_id
from .tx import Engine, T

__all__ = ["Server"]

R = TypeVar("R")


class Server:
    """One reference-server instance."""

    def __init__(self, settings: Settings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.store = Store(settings.db_path)
        # The durable offset of a test clock applies with or without --test-clock: time never goes back.
        self.clock = ServerClock(clock or SystemClock(), ServerClock.load(self.store.read()))
        self._namespaces: set[str] = set()  # namespaces known to exist (see namespace_exists)
        self.engine = Engine(self.store, self.clock, settings)
        self.hub = Hub()
        self.observers = ObserverSet()
        self._event_log: JsonLinesEventLog | None = None
        if settings.event_log:
            self._event_log = JsonLinesEventLog(settings.event_log)
            self.observers.add(self._event_log)
        self.app = App(
            worker_token=settings.worker_token,
            operator_token=settings.operator_token,
            admin_token=settings.admin_token,
            auth_token=settings.auth_token,
            auth_token_admin_beside_roles=settings.auth_token_admin_beside_roles,
            namespace_exists=self.namespace_exists,
        )
        capabilities = caps.server_capabilities()
        # §5.2: the optional command types are advertised only because they are implemented.
        capabilities["supported_workflow_task_commands"] = [
            *capabilities["supported_workflow_task_commands"],
            *IMPLEMENTED_OPTIONAL_COMMANDS,
        ]
        sessions.install(self.store.db, capabilities)
        cancellation.install(self.store.db, capabilities)
        self.app.advertise(capabilities)
        self.server_id = new_id()
        self.poller = Poller(settings, self, self.hub, self.clock)
        self.scheduler = Scheduler(settings, self.run_tx, self.clock.now_us)
        self.scheduler.add(enforce_activity_timeouts, *TIMEOUT_WATCHES)
        self.scheduler.add(sweep_query_tasks, *DEADLINE_WATCHES)
        self.scheduler.add(sessions.settle_due, *sessions.DUE_WATCHES)
        self.scheduler.add(enforce_cancellation_deadlines, *CLEANUP_DEADLINE_WATCHES)
        self.scheduler.install(self.store.db)
        self.http: HttpServer | None = None
        with self.engine.tx() as t:
            t.db.execute("INSERT OR IGNORE INTO namespaces (name, created_at) VALUES ('default', ?)", (t.now,))
        self._register_routes()

    def _register_routes(self) -> None:
        app = self.app
        app.mount(OPEN, open_routes.Routes(app, self, self.server_id))
        app.mount(WORKER, registrations.Routes(self))
        app.mount(WORKER, workflow_tasks.Routes(self, self.poller))
        app.mount(CONTROL, workflows.Routes(self))
        app.mount(CONTROL, messages.Routes(self))
        app.mount(CONTROL, cancellation_requests.Routes(self))
        app.mount(CONTROL, task_queues.Routes(self, self.poller))
        app.mount(WORKER, activity_tasks.Routes(self, self.poller))
        app.mount(WORKER, query_tasks.Routes(self, self.poller))
        app.mount(WORKER, worker_sessions.Routes(self))
        app.mount(WORKER, cooperative.Routes(self))
        app.mount(CONTROL, session_visibility.Routes(self))
        if self.settings.test_clock:
            app.mount(CONTROL, test_clock.Routes(self))

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self.scheduler.start()
        self.http = HttpServer(
            self.handle,
            error_responder=self.app.shell_error,
            max_body_bytes=self.settings.max_body_bytes,
            max_header_bytes=self.settings.max_header_bytes,
            clock=self.clock.now_seconds,
        )
        await self.http.start(host, port)
        return self.http.url

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
        await self.scheduler.stop()
        await self.observers.drain()
        if self._event_log is not None:
            self._event_log.close()
        self.store.close()

    async def handle(self, request: Request) -> Response:
        return await self.app.handle(request)

    # -- ports.Core / ports.Waits ------------------------------------------------------------------------

    def run_tx(self, fn: Callable[[T], R]) -> R:
        """Run ``fn`` in one transaction, then publish its effects (wake-ups, observer events)."""
        with self.engine.tx() as t:
            result = fn(t)
        self.publish(t)
        return result

    def read(self) -> sqlite3.Connection:
        """Committed state, for reads outside a transaction."""
        return self.store.read()

    def publish(self, t: T) -> None:
        for key in t.fx.wake:
            self.hub.notify(key)
        for run_id in t.fx.run_changed:
            self.hub.notify(("run", run_id))
        if t.fx.due is not None:  # a watched write (tx.Watch): perhaps work due before the scheduler's next pass
            self.scheduler.note_due(t.fx.due)
        self.observers.offer(t.fx.transitions)

    def namespace_exists(self, namespace: str) -> bool:
        # Every request asks; a namespace is never deleted, so one found once is remembered (a miss is re-read).
        if namespace in self._namespaces:
            return True
        row = self.store.read().execute("SELECT 1 FROM namespaces WHERE name = ?", (namespace,)).fetchone()
        if row is not None:
            self._namespaces.add(namespace)
        return row is not None

    # -- test knobs ----------------------------------------------------------------------------------------

    async def advance_clock(self, seconds: float) -> int:
        """ports.ClockControl: move the clock ``seconds`` forward — durably first, then in memory — run every
        scheduler step due at the new instant, and wake every held request to re-read the clock. The new now."""
        if seconds > 0:
            offset = self.clock.offset_us + round(seconds * 1_000_000)
            self.run_tx(lambda t: self.clock.store(t.db, offset))
            self.clock.apply(offset)
            self.scheduler.run_steps()
            self.hub.notify_all()
            self.scheduler.wake()
        return self.clock.now_us()

    @property
    def unavailable_queues(self) -> set[tuple[str, str]]:
        """Appendix C's matching switch (kept by the poller)."""
        return self.poller.unavailable_queues
