"""Control-plane routes (``/api/workflows/*``, ``/api/task-queues/*``), one module per resource."""
