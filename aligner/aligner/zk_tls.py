"""Why a first ZooKeeper session does not come, when TLS is the reason.

kazoo only logs a TLS failure and retries forever; :meth:`aligner.ledger.Ledger.connect` asks
:func:`tls_mismatch` while a first session is late and turns a mismatch into one clear error at once.
"""

from __future__ import annotations

import socket
import ssl

from kazoo.hosts import collect_hosts

from aligner.settings import ZkTls

# ---- TLS diagnosis ------------------------------------------------------------------------------

_PROBE_TIMEOUT = 1.0
"""Seconds each step of a TLS probe may take (it runs only while a first session is late)."""


def _alert(exc: ssl.SSLError) -> bool:
    """The peer sent a TLS alert: it speaks TLS (and refused something). ``reason`` is OpenSSL's reason
    code name (``SSLV3_ALERT_BAD_CERTIFICATE``, ``TLSV13_ALERT_CERTIFICATE_REQUIRED``, ...)."""
    return isinstance(exc.reason, str) and "_ALERT_" in exc.reason


def _speaks_plain_zookeeper(host: str, port: int) -> bool:
    """Whether ``host:port`` answers a plaintext four-letter word (``imok``, or "not in the whitelist")."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT) as s:
            s.sendall(b"ruok")
            answer = s.recv(64)
    except OSError:
        return False
    return bool(answer) and answer[:1] not in (b"\x15", b"\x16")  # not a TLS alert or handshake record


def _probe_tls(host: str, port: int, tls: ZkTls | None) -> str | None:
    where = f"{host}:{port}"
    try:
        raw = socket.create_connection((host, port), timeout=_PROBE_TIMEOUT)
    except OSError:
        return None  # down or unreachable: an outage, which kazoo rides out
    with raw:
        if tls is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            try:
                ctx.wrap_socket(raw, server_hostname=host).close()
            except ssl.SSLError as exc:
                if not _alert(exc):
                    return None
            except OSError:
                return None
            return (f"{where} is a TLS (secure) client port and this client does not use TLS: set "
                    "ALIGNER_ZK_TLS_CA (and ALIGNER_ZK_TLS_CERT/ALIGNER_ZK_TLS_KEY when it requires a client "
                    "certificate); for the embedded stack `aligner stack env` prints them")
        refused = (f"ZooKeeper at {where} refused the TLS client certificate: set ALIGNER_ZK_TLS_CERT and "
                   "ALIGNER_ZK_TLS_KEY to a certificate signed by a CA it trusts")
        try:
            s = tls.context().wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError as exc:
            return (f"ZooKeeper's TLS certificate at {where} is not accepted ({exc.verify_message}): "
                    f"ALIGNER_ZK_TLS_CA must be the CA that signed it, and it must name {host}")
        except ssl.SSLError as exc:
            if _alert(exc):
                return refused
            return _plain_port(where, host, port)
        except OSError:
            return _plain_port(where, host, port)
        with s:  # TLS 1.3: the server judges a client certificate after the handshake; its alert comes next
            s.settimeout(_PROBE_TIMEOUT / 2)
            try:
                s.recv(1)
            except ssl.SSLError as exc:
                return refused if _alert(exc) else None
            except OSError:  # a timeout included: the server waits for our request, it accepted us
                return None
    return None


def _plain_port(where: str, host: str, port: int) -> str | None:
    if not _speaks_plain_zookeeper(host, port):
        return None
    return (f"{where} is a plaintext client port, not TLS: use ZooKeeper's secureClientPort, or unset "
            "ALIGNER_ZK_TLS_CA")


def tls_mismatch(hosts: str, tls: ZkTls | None) -> str | None:
    """Why no session can come from ``hosts`` when the reason is TLS, else None (kazoo only logs it and
    retries forever: a plaintext client on a secure port, TLS on a plaintext port, an untrusted server
    certificate or a refused client certificate). Only what a server proves counts: a server that is
    down or silent is an outage, never reported here."""
    try:
        addresses, _chroot = collect_hosts(hosts)
    except ValueError:
        return None
    for host, port in addresses:
        found = _probe_tls(host, port, tls)
        if found is not None:
            return found
    return None
