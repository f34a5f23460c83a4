"""The public documents the requirements come from, and a citation of one of their sections.

A requirement's provenance is a tuple of :class:`Citation`: a document of :data:`DOCUMENTS` and one of the
sections that document declares (its own heading; an English name beside a heading in another language).
``docs/reference.md`` lists the documents, where each is published, and every section cited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = ["DOCUMENTS", "READING_NOTES", "Citation", "Document", "cite"]


@dataclass(frozen=True, slots=True, eq=False)
class Document:
    """One public document: its own name, a short name for tables, where it is published, its sections.

    ``sections`` maps the name a citation uses to the heading as the document writes it ("" when the two are
    the same). A document is its own identity: two are equal only when they are the same object.
    """

    key: str
    name: str
    short: str
    published: str
    sections: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Citation:
    """A section of a document, with an optional detail inside it (a row, a field, a function)."""

    document: Document
    section: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.section not in self.document.sections:
            raise ValueError(f"{self.document.name} has no section {self.section!r}")

    def __str__(self) -> str:
        text = f"{self.document.name}, {self.section}"
        return f"{text} ({self.detail})" if self.detail else text

    @property
    def short(self) -> str:
        """The citation in a table cell: the document's short name and the section."""
        return f"{self.document.short} · {self.section}"


def _doc(key: str, name: str, short: str, published: str, sections: Mapping[str, str]) -> Document:
    return Document(key, name, short, published, MappingProxyType(dict(sections)))


WORKER_PROTOCOL: Final = _doc(
    "worker-protocol",
    "Durable Workflow worker protocol 1.20",
    "Worker protocol 1.20",
    "the Durable Workflow documentation, version 2.0, page “Worker-протокол” (in Ukrainian)",
    {
        "Protocol version": "Версія протоколу",
        "Discovery capabilities": "",
        "Execution semantics": "Семантика виконання",
        "Workflow Task Bridge": "",
        "Paginated history": "Історія зі сторінками",
        "History compression": "Стиснення історії",
        "Long-poll semantics": "Семантика long poll",
        "Poll response status": "Статус poll-відповіді",
        "Completion, heartbeat and fail requests": "Запити completion, heartbeat і fail",
        "Command types": "Типи команд",
        "Query tasks": "",
        "Activity Task Bridge": "",
        "Payload codecs": "Codecs payload",
        "Codec avro": "",
        "Wire format: the payload envelope": "Формат передачі: оболонка payload",
        "Starting a workflow": "Запуск workflow",
    },
)

DISPATCH: Final = _doc(
    "dispatch",
    "Dispatch, Lease and Lifecycle Hooks",
    "Dispatch, Lease and Hooks",
    "AI Infra Handbook, “Run 真正怎样从 API 跑到 Worker：Dispatch、Lease 与 Lifecycle Hooks” (in Chinese)",
    {
        "Command path and work dispatch are separate": "Command Path 与 Work Dispatch 分开",
        "The queue is a notification, not canonical state": "Queue 是 Notification，不是 Canonical State",
        "Lifecycle hooks are observers": "Lifecycle Hooks 是 Observer / Extension Point",
        "Hooks need a failure policy too": "Hook 也要有失败策略",
        "How to verify": "如何验证",
        "Self-check": "自测",
    },
)

SCHEDULING: Final = _doc(
    "scheduling",
    "Airflow scheduling: from DAG file to task execution",
    "Airflow scheduling",
    "AI Infra Handbook, chapter 4, “调度工作流程：从 DAG 文件到 Task 执行” (in Chinese)",
    {
        "4.3 DAG Run and TaskInstance state machine": "4.3 DAG Run 与 TaskInstance 状态机",
        "4.4 Retries": "4.4 重试机制",
    },
)

SERVER: Final = _doc(
    "server",
    "Durable Workflow Server",
    "Durable Workflow Server",
    "github.com/durable-workflow/server, the PHP server (its worker protocol 1.0–1.1 releases)",
    {
        "Authentication and roles": "",
        "Namespaces": "",
        "AuthNamespaceProtocolOrderingContractTest": "",
        "Worker protocol envelope": "",
        "Control-plane version": "",
        "HealthController::clusterInfo": "",
        "Worker registration": "",
        "WorkflowTaskPoller": "",
        "WorkflowTaskPoller::coordinatedPoll": "",
        "Workflow task history, heartbeat, complete and fail": "",
        "Leases and redelivery": "",
        "Query tasks": "",
        "Activity tasks": "",
        "Control-plane workflow routes": "",
    },
)

WORKFLOW_PACKAGE: Final = _doc(
    "workflow-package",
    "Durable Workflow package 1.15",
    "Workflow package 1.15",
    "github.com/durable-workflow/workflow, the PHP engine package (worker protocol 1.15)",
    {
        "WorkerProtocolVersion": "",
        "WorkerProtocolVersion::workerSessionSemantics": "",
        "Worker sessions": "docs/architecture/worker-sessions.md",
        "HistoryPayloadCompression": "",
        "ActivityRetryPolicy": "",
        "Activity timeouts": "",
        "Status enums": "",
        "Child workflows": "",
        "Platform protocol specs": "resources/conformance/suite-v41/platform-protocol-specs",
        "Avro Value schema and golden vectors": "",
    },
)

PYTHON_SDK: Final = _doc(
    "python-sdk",
    "Durable Workflow Python SDK 2.12.0",
    "Python SDK 2.12.0",
    "PyPI durable-workflow 2.12.0",
    {
        "Worker handshake": "",
        "Replay": "",
        "Child workflow cancellation": "",
    },
)

READINGS: Final = _doc(
    "readings",
    "This suite's readings",
    "Suite reading",
    "docs/reference.md, section Readings: what the suite holds where the documents are silent or disagree",
    {
        "Where the documents disagree": "",
        "Robustness": "",
        "Cooperative cancellation": "",
        "Full-access token": "",
        "Worker sessions": "",
        "Created task ids": "",
    },
)

# What each reading holds, shown under "Readings" in docs/reference.md.
READING_NOTES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "Where the documents disagree": (
            "Where worker protocol 1.20 and the earlier server or workflow package releases differ, the 1.20 "
            "document decides; where they state the same rule in other words, the requirement states the rule "
            "both allow (for example an error body carrying both `error` and `message`)."
        ),
        "Robustness": (
            "The documents do not say what a server answers to a body that is not what a route expects; the "
            "suite holds a server to answer it with a 4xx in the plane's envelope, never a 5xx."
        ),
        "Cooperative cancellation": (
            "`request_cancellation` asks a child to clean up and close; the documents name the request, not "
            "its end. The suite holds that the child may clean up and close, that a child still open past its "
            "cleanup deadline is closed by the server, and that the parent's history records how it ended — "
            "after the parent's own terminal event when the parent closed first."
        ),
        "Full-access token": (
            "A full-access token serves both planes even when role tokens are configured as well, so a client "
            "configured with one token keeps working when role tokens are added (the server's legacy token "
            "becomes admin-only instead)."
        ),
        "Worker sessions": (
            "A session that loses its lease or holder while forbidding reacquisition is `failed` and never "
            "admitted again; operators read sessions at `/api/worker-sessions[/{id}]` (the contract names "
            "operator visibility but no path)."
        ),
        "Created task ids": (
            "A completion's `created_task_ids` lists the tasks the batch created (its activity, timer, child and "
            "next tasks). A run the batch started — a child, or the next run of a `continue_as_new` — is listed by "
            "its first workflow task, the id a poll then leases, never by the run's id."
        ),
    }
)

DOCUMENTS: Final[tuple[Document, ...]] = (
    WORKER_PROTOCOL,
    DISPATCH,
    SCHEDULING,
    SERVER,
    WORKFLOW_PACKAGE,
    PYTHON_SDK,
    READINGS,
)


def cite(document: Document, section: str, detail: str = "") -> Citation:
    """A checked citation: ``section`` must be one ``document`` declares."""
    return Citation(document, section, detail)
