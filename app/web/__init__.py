"""The web app's assembly: the app factory (:mod:`steady.server.web.main`), the error boundary, the API docs,
and ``steady serve`` in a child process (:mod:`steady.server.web.devserver`).

Sits above every domain it mounts; only the CLI imports it.
"""
