"""The agent side: ``steady worker`` leases runs from the server, starts each in a fresh subprocess
(:mod:`steady.worker.agent.runner`), captures what it reports and sends it back.

Imports the contract (:mod:`steady.worker.contract`), never the in-run side.
"""
