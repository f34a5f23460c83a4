"""The reference server: worker protocol 1.20 implemented plainly on asyncio and SQLite."""
