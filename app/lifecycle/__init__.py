"""A run's lifecycle: leasing, the transitions (complete, fail, release, cancel, expire), metric ingest and its
committer, run credentials, and the runs' HTTP API.

The runs' table access (:mod:`steady.server.runs`: repository, schemas) sits below the domains this package
drives; what happens when a run settles is announced through :mod:`steady.server.runs.settled`.
"""
