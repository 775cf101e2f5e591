"""What both sides of the worker import: the wire protocol with the server, the code archive format,
the event stream between a run and its agent, the digests, the determinism levels and the host fingerprint.

Imports no other part of the worker (and the server may import this package; tests/test_architecture.py).
"""
