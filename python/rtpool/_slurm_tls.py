"""TLS for ``SlurmCluster``: a self-signed certificate naming the host the nodes connect to,
and the copy of the master's certificate the workers trust (``--ca-file``).

The private key stays on this machine, in a 0700 directory of its local temporary space (not
the job directory, which the nodes see); only the certificate, which is public, goes to the job
directory. The master's own ``--tls-self-signed`` names only loopback and the listen address,
and ``SlurmCluster`` listens on ``0.0.0.0``: the nodes would connect by a name the certificate
does not carry, hence this one, made with the ``openssl`` command.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from typing import Tuple

from . import _slurm_jobs as jobs
from .errors import RtpoolError

__all__ = ["self_signed", "worker_ca_file"]

#: Days the self-signed certificate is valid (it lives as long as one SlurmCluster).
_DAYS = 30


def _subject_alt_names(host: str) -> str:
    names = ["DNS:localhost", "IP:127.0.0.1", "IP:::1"]
    try:
        ipaddress.ip_address(host)
        entry = f"IP:{host}"
    except ValueError:
        entry = f"DNS:{host}"
    if entry not in names:
        names.append(entry)
    return ",".join(names)


def self_signed(host: str) -> Tuple[str, str, str]:
    """A certificate for ``host``, localhost, 127.0.0.1 and ::1 and its key (mode 0600) in a
    new 0700 directory; returns ``(directory, cert, key)``.

    Raises:
        RtpoolError: ``openssl`` is missing or failed (its message included).
    """
    if shutil.which("openssl") is None:
        raise RtpoolError(
            "SlurmCluster(tls=True) makes its certificate with the openssl command, which is "
            "not installed; install openssl, or pass tls_cert= and tls_key="
        )
    tls_dir = tempfile.mkdtemp(prefix="rtpool-slurm-tls-")  # 0700
    cert, key = os.path.join(tls_dir, "cert.pem"), os.path.join(tls_dir, "key.pem")
    cmd = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    cmd += ["-nodes", "-keyout", key, "-out", cert, "-days", str(_DAYS), "-subj", f"/CN={host}"]
    cmd += ["-addext", f"subjectAltName={_subject_alt_names(host)}"]
    # umask 077 via the child: openssl creates the key file readable by its owner only.
    old = os.umask(0o077)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        os.umask(old)
    if proc.returncode != 0:
        shutil.rmtree(tls_dir, ignore_errors=True)
        raise RtpoolError(f"openssl could not make a certificate: {proc.stderr.strip()}")
    os.chmod(key, 0o600)
    return tls_dir, cert, key


def worker_ca_file(ca_file: str, job_dir: str) -> str:
    """Copy the certificate workers trust into the job directory (which the nodes see) as
    ``ca.pem``; returns its path. A private key in ``ca_file`` is refused, so a misplaced
    argument cannot publish one."""
    try:
        with open(ca_file, encoding="utf-8") as f:
            pem = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise RtpoolError(f"cannot read the CA file {ca_file}: {exc}") from None
    if "PRIVATE KEY" in pem:
        raise RtpoolError(
            f"{ca_file} holds a private key; ca_file must be the certificate (or CA) only"
        )
    if "BEGIN CERTIFICATE" not in pem:
        raise RtpoolError(f"{ca_file} holds no PEM certificate")
    path = os.path.join(job_dir, "ca.pem")
    jobs.write_private(path, pem)
    return path
