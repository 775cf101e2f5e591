"""The in-run side: what executes inside a run's subprocess, next to (or as) the user's training code:
the harness, the SDK, the command shim, determinism and digests applied in-process, the framework adapters
and the built-in workloads.

Imports the contract (:mod:`steady.worker.contract`), never the agent side.
"""
