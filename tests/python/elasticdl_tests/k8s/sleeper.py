"""A stand-in replica for platform tests: ``python -m elasticdl_tests.k8s.sleeper
[--seconds S] [--exit-code C] [--port P]``. Prints its environment (MY_POD_IP, ...) and
argv, optionally listens on 127.0.0.1:P, sleeps, exits with C. Handles SIGTERM like a
well-behaved replica (exit 143)."""

import argparse
import json
import os
import signal
import socket
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3600)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    args, _ = parser.parse_known_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(
        json.dumps(
            {
                "argv": sys.argv,
                "env": {k: v for k, v in os.environ.items() if k.startswith(("MY_", "EDL_"))},
            }
        ),
        flush=True,
    )
    server = None
    if args.port:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", args.port))
        server.listen()
    time.sleep(args.seconds)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
