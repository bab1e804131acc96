"""Connect to a running master and run a few tasks on its workers.

Start a master and at least one worker first (on any machines)::

    rtpool master --listen 0.0.0.0:7070 --data-dir /var/lib/rtpool   # prints the tokens
    rtpool worker --master HOST:7070 --token WORKER_TOKEN

then::

    python examples/remote.py HOST:7070 CLIENT_TOKEN
    RTPOOL_ADDRESS=HOST:7070 RTPOOL_TOKEN=CLIENT_TOKEN python examples/remote.py

The task function lives in an importable module (rtpool_bench.demo, which the rtpool wheel
installs next to rtpool), so the workers import it by name; a function defined in this script
would travel by value (cloudpickle) just as well.
"""

import os
import sys

import rtpool
from rtpool_bench.demo import smallest_factor


def main(argv):
    """Connect with the address and token from ``argv`` or the environment; run some tasks."""
    address = argv[1] if len(argv) > 1 else os.environ.get("RTPOOL_ADDRESS")
    token = argv[2] if len(argv) > 2 else os.environ.get("RTPOOL_TOKEN")
    if not address or not token:
        print(
            "usage: python examples/remote.py HOST:PORT CLIENT_TOKEN "
            "(or set RTPOOL_ADDRESS and RTPOOL_TOKEN)",
            file=sys.stderr,
        )
        return 2
    with rtpool.Client(address, token=token) as client:
        print(f"2 ** 10 = {client.submit(pow, 2, 10).result(timeout=30)}")
        numbers = [1000003 * 1000033, 91, 97, 1001]
        package = client.submit_many(smallest_factor, numbers)
        for n, factor in zip(numbers, package.results(timeout=120)):
            print(f"smallest_factor({n}) = {factor}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
