"""Named functions for the resource tests of calls (``tests/test_resources_rpc.py``): which
worker ran a call (its tag, ``tasks.resources.TAG``), which devices it saw, how many calls ran
at once on one host, and a call that waits for the test's word.

Served with ``--serve tasks.rpc_resources`` (this directory is on the workers' PYTHONPATH).
"""

from rtpool import remote
from tasks import resources as rtasks


@remote("chain")
def chain(before: str) -> str:
    """chain returns its input, a comma and the tag of the worker that ran it."""
    tag, _, _ = rtasks.where()
    return f"{before},{tag}"


@remote("overlap_call")
def overlap_call(shared_dir: str, index: int) -> str:
    """overlap_call is ``tasks.resources.overlap`` as a call: ``most|devices|shared|tag``."""
    most, devices, shared, tag = rtasks.overlap(shared_dir, index)
    return f"{most}|{devices}|{int(shared)}|{tag}"


@remote("held_call")
def held_call(shared_dir: str) -> str:
    """held_call is ``tasks.resources.held`` as a call: ``tag|devices``."""
    tag, devices, _ = rtasks.held(shared_dir)
    return f"{tag}|{devices}"
