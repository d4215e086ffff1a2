"""Who may talk to the learner: mutual TLS and the shared token (`TransportSecurity`), and which listen
addresses need them.

Listen addresses are loopback and the unix socket by default; a non-loopback address needs --auth_token(_file)
or mutual TLS, or an explicit --allow_insecure_remote (see `check_listen_security`). The security is built once
from the flags and passed to whoever serves or dials; there is no process-wide default.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import os
from typing import Any

import grpc

TOKEN_KEYS = ("authorization", "x-seed-token")  # metadata keys the token may travel in; "authorization": "Bearer T"
REDACTED = "<redacted>"  # what a config shows once its token has been taken out (never logged or checkpointed)


class TransportConfigError(ValueError):
    """Transport flags that cannot work together (names the flag, the value received and what is expected)."""


@dataclasses.dataclass(frozen=True)
class TransportSecurity:
    """How the learner's server and the actors' channels authenticate each other.

    tls_cert, tls_key: PEM files of this side's certificate and key (server: its serving cert; actor: its client cert).
    tls_ca: PEM file of the CA that signed the other side's certificate. All three together enable mutual TLS.
    auth_token: the shared secret, from --auth_token or the file named by --auth_token_file ('' = none).
    tls_server_name: actor only: the name the server certificate must carry when it differs from the dialled host.
    allow_insecure_remote: learner only: listen on a non-loopback address with neither token nor TLS.
    """

    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    auth_token: str = dataclasses.field(default="", repr=False)
    tls_server_name: str = ""
    allow_insecure_remote: bool = False

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def authenticated(self) -> bool:
        return self.tls or bool(self.auth_token)

    @classmethod
    def from_config(cls, config: Any, read_files: bool = True) -> TransportSecurity:
        """From any config with the TransportOptions fields (seed.config); reads --auth_token_file.

        read_files=False (e.g. --print_config) checks the flags without touching the files; the token is then
        REDACTED. A config whose token was already redacted (seed.learner.main hands the security it built from
        the flags to the Learner, then blanks the token) cannot yield it again: pass that security on instead.
        """
        token = getattr(config, "auth_token", "")
        if token == REDACTED:
            raise TransportConfigError(f"auth_token: got {REDACTED!r} (already moved out of this config), expected "
                                       "the token itself; pass the TransportSecurity built from the flags instead")
        token_file = getattr(config, "auth_token_file", "")
        if token and token_file:
            raise TransportConfigError("--auth_token and --auth_token_file: got both, expected at most one")
        if token_file and not read_files:
            token = REDACTED
        elif token_file:
            try:
                with open(token_file) as f:
                    token = f.read().strip()
            except OSError as error:
                raise TransportConfigError(f"--auth_token_file: cannot read {token_file!r}: {error.strerror}") from None
            if not token:
                raise TransportConfigError(f"--auth_token_file: got an empty file {token_file!r}, expected a token")
        tls = {name: getattr(config, name, "") for name in ("tls_cert", "tls_key", "tls_ca")}
        given = [name for name, value in tls.items() if value]
        if given and len(given) != 3:
            missing = sorted(set(tls) - set(given))
            raise TransportConfigError(f"--{', --'.join(missing)}: got none, expected --tls_cert, --tls_key and "
                                       "--tls_ca together (mutual TLS)")
        for name in given if read_files else ():
            if not os.path.isfile(tls[name]):
                raise TransportConfigError(f"--{name}: got {tls[name]!r}, expected an existing PEM file")
        return cls(auth_token=token, tls_server_name=getattr(config, "tls_server_name", ""),
                   allow_insecure_remote=bool(getattr(config, "allow_insecure_remote", False)), **tls)

    def _read(self, name: str) -> bytes:
        with open(getattr(self, name), "rb") as f:
            return f.read()

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self._read("tls_key"), self._read("tls_cert"))],
                                           root_certificates=self._read("tls_ca"), require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self._read("tls_ca"),
                                            private_key=self._read("tls_key"), certificate_chain=self._read("tls_cert"))

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata for the Stream call (the token, if any)."""
        return (("authorization", f"Bearer {self.auth_token}"),) if self.auth_token else ()


def listen_addresses(server_address: str) -> list[str]:
    addresses = [a.strip() for a in server_address.split(",") if a.strip()]
    if not addresses:
        raise ValueError(f"--server_address: got {server_address!r}, expected a comma-separated list of addresses")
    return addresses


def is_loopback(address: str) -> bool:
    """True for unix sockets and TCP addresses on the loopback interface (127.0.0.0/8, ::1, localhost)."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost, or an empty host (all interfaces)
        return False


def check_listen_security(addresses: list[str], security: TransportSecurity) -> None:
    """Refuses a non-loopback listen address without a token or TLS unless --allow_insecure_remote is set."""
    if security.authenticated or security.allow_insecure_remote:
        return
    remote = [a for a in addresses if not is_loopback(a)]
    if remote:
        raise TransportConfigError(
            f"--server_address: got {','.join(remote)}, a non-loopback address with no --auth_token/--auth_token_file "
            "and no --tls_cert/--tls_key/--tls_ca; expected unix:/path or 127.0.0.1:PORT, or credentials, or "
            "--allow_insecure_remote to let anyone who reaches the port drive the learner")


def check_token(metadata: tuple, expected: str) -> str | None:
    """None if the call metadata carries `expected` (constant-time compare), else why not (never the secret)."""
    values = {key: value for key, value in metadata if key in TOKEN_KEYS}
    if not values:
        return (f"metadata {TOKEN_KEYS[0]}: got none, expected 'Bearer <token>' (or {TOKEN_KEYS[1]}: <token>) "
                "with the learner's --auth_token")
    for key, value in values.items():
        got = value[len("Bearer "):] if key == "authorization" and value.startswith("Bearer ") else value
        if isinstance(got, bytes):
            got = got.decode("latin-1")
        if hmac.compare_digest(got.encode("utf-8", "surrogateescape"), expected.encode()):
            return None
    return (f"metadata {'/'.join(values)}: got a wrong token, expected the learner's --auth_token "
            "(see --auth_token_file)")
