"""Runs moto's DynamoDB-compatible server for the integration tests.

Single-threaded on purpose: moto's threaded server has no per-request locking, and its
transaction rollback restores a copy of the whole table, which would erase concurrent
commits (ARCHITECTURE section 6).

Usage: moto_server.py LOGFILE PORTFILE

It binds a port the system chooses and only then writes that port to PORTFILE (whole, by
rename). A caller that picked a free port and handed it over would race every other socket
opened meanwhile: an emulator in the same test process once took the port first, and the
tests' DynamoDB calls reached it ("Unknown target DynamoDB_20120810.CreateTable").

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
    log_path = sys.argv[1]
    port_path = sys.argv[2]

    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = log
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO)

    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", 0, app, threaded=False)
    partial = port_path + ".partial"
    with open(partial, "w") as f:
        f.write(f"{server.port}\n")
    os.replace(partial, port_path)
    logging.info("moto listening on 127.0.0.1:%d", server.port)
    server.serve_forever()


if __name__ == "__main__":
    main()
