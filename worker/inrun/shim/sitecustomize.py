"""Imported by Python at start-up in a command workload's interpreter (this folder is first on
its PYTHONPATH): applies the run's determinism level in-process and opens the SDK. Only the
first interpreter does it (the variable is removed), not the processes it starts."""

import os

if os.environ.pop("STEADY_COMMAND_SHIM", None) == "1":
    try:
        from steady.worker.inrun import command as _steady_command

        _steady_command.start()
    except Exception as _exc:  # noqa: BLE001 - never stop the user's program from starting
        import sys

        print(f"steady: could not set up the run in-process ({type(_exc).__name__}: {_exc}); "
              "environment-level determinism still applies", file=sys.stderr)
