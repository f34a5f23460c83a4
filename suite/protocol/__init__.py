"""The pure protocol model of worker protocol 1.20.

No sockets, no asyncio, no sqlite, no httpx and no clock reads live here: time is always an argument.
The reference server and the conformance checks both import this package; it imports neither.
"""
