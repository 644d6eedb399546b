"""Runs moto's DynamoDB-compatible server for the integration tests.

Single-threaded on purpose: moto's threaded server has no per-request locking, and its
transaction rollback restores a copy of the whole table, which would erase concurrent
commits (ARCHITECTURE section 6).

Usage: moto_server.py PORT LOGFILE

Everything goes to LOGFILE, never to stdout/stderr: an inherited pipe held open by this
process would keep CI waiting. The process exits as soon as its stdin closes, so it cannot
outlive the test process that started it, however that process ends.
"""

import logging
import os
import sys
import threading


def _exit_when_stdin_closes() -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(0)


def main() -> None:
    port = int(sys.argv[1])
    log_path = sys.argv[2]

    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = log
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO)

    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", port, app, threaded=False, use_reloader=False)


if __name__ == "__main__":
    main()
