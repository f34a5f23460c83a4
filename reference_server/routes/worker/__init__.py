"""Worker-plane routes (``/api/worker/*``), one module per resource."""
