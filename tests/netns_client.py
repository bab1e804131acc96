"""A client on a host of its own, for the multi-host tests (``rtpool_bench/netns.py``).

Run in a namespace (``Network.run(host, [python, netns_client.py, ...])``) with the client
token in ``$RTPOOL_TOKEN`` and ``tests/`` on ``PYTHONPATH``. It connects to the master (over
TLS with ``--ca-file``), submits ``--tasks`` tasks of ``tasks.logged_netns`` and prints one JSON
line: ``{"results": [[x, netns], ...], "duplicates": N}``; or, when the connection is refused,
``{"refused": "ConnectError", "message": "..."}`` (and exit code 0: the test judges it).
"""

from __future__ import annotations

import argparse
import json

import rtpool
import tasks
from rtpool.errors import RtpoolError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--master", required=True, help="HOST:PORT")
    ap.add_argument("--ca-file", help="PEM of the CA to trust (implies TLS)")
    ap.add_argument("--tasks", type=int, default=0)
    ap.add_argument("--runs", help="file each task appends its argument to")
    ap.add_argument("--seconds", type=float, default=0.0, help="each task sleeps this long")
    args = ap.parse_args()
    try:
        client = rtpool.Client(args.master, ca_file=args.ca_file, connect_timeout=10)
    except RtpoolError as exc:
        print(json.dumps({"refused": type(exc).__name__, "message": str(exc)}), flush=True)
        return 0
    with client:
        futures = [
            client.submit(tasks.logged_netns, x, args.runs, args.seconds) for x in range(args.tasks)
        ]
        results = [list(f.result(timeout=60)) for f in futures]
        out = {"results": results, "duplicates": client._conn.duplicate_results}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
