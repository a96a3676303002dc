#!/bin/sh
# The images' entrypoint (run under tini, which forwards SIGTERM and reaps children).
# The command picks the service: `weir gateway`, `weir batcher`, `weir worker --pool cpu`.
# A bare subcommand or option works too (`gateway`, `worker --pool gpu`, `--help`): whatever
# is not a program on PATH goes to weir. Anything else (`python examples/build_models.py`,
# `sh`) runs as given.
set -eu
if [ "$#" -eq 0 ] || ! command -v "$1" >/dev/null 2>&1; then
    exec weir "$@"
fi
exec "$@"
