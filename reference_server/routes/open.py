"""Open and discovery routes: health, readiness (no auth, no headers) and ``GET /api/cluster/info`` (§5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from suite.protocol import capabilities as caps
from suite.protocol.versions import ADVERTISED_VERSION

from ..app import DISCOVERY, App, Ctx, route
from ..ports import Core

__all__ = ["Routes"]


@dataclass(frozen=True)
class Routes:
    app: App
    core: Core
    server_id: str

    @route("GET", "/api/health")
    async def health(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        return 200, {"status": "serving", "protocol_version": ADVERTISED_VERSION}

    @route("GET", "/api/ready")
    async def ready(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        self.core.read().execute("SELECT 1").fetchone()
        return 200, {"status": "ready"}

    @route("GET", "/api/cluster/info", plane=DISCOVERY)
    async def cluster_info(self, ctx: Ctx) -> tuple[int, dict[str, Any]]:
        workers = (
            self.core.read()
            .execute(
                "SELECT worker_id, task_queue, build_id FROM workers WHERE namespace = ? AND status = 'active'",
                (ctx.namespace,),
            )
            .fetchall()
        )
        return 200, {
            "server_id": self.server_id,
            "version": "0.1.0",
            "default_namespace": "default",
            "supported_sdk_versions": {"python": ">=2.12.0"},
            "capabilities": caps.platform_capabilities(),
            "worker_fleet": {
                "namespace": ctx.namespace,
                "active_workers": len(workers),
                "queues": sorted({w["task_queue"] for w in workers}),
                "build_ids": sorted({w["build_id"] for w in workers if w["build_id"]}),
                "workers": [dict(w) for w in workers][:100],
            },
            "task_repair": {"policy": {}, "candidates": 0},
            "limits": {
                "max_payload_bytes": 2 * 1024 * 1024,
                "max_memo_bytes": 256 * 1024,
                "max_search_attributes": 100,
                "max_search_attribute_key_length": 128,
                "max_search_attribute_value_bytes": 2048,
                "max_operation_name_length": 256,
                "max_pending_activities": 2000,
                "max_pending_children": 2000,
            },
            "structural_limits": {},
            "client_compatibility": {"authority": "protocol_manifests"},
            "auth_composition_contract": caps.auth_composition_contract(),
            "control_plane": caps.control_plane_contract(),
            "worker_protocol": {
                "version": ADVERTISED_VERSION,
                "server_capabilities": self.app.capabilities,
                "test_profile": self.core.settings.test_profile(),
            },
        }
