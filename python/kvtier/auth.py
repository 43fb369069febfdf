"""The token a connector presents to its daemon (docs/security.md#tenants).

A daemon with ``tenants`` asks every connection, local ones too, for a token
in HELLO: a tenant's token (which reaches that tenant's namespaces only) or
the daemon's ``tcp_token``. The connectors read it from their settings
(``token``, or ``token_file``) or from the environment (``KVTIER_TOKEN``,
or ``KVTIER_TOKEN_FILE``), in that order. A token file's trailing white
space is trimmed, as the daemon trims its own token files. The token is
never logged and never part of a settings object's repr.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional


def resolve_token(token: str = "", token_file: str = "", environ: Optional[Mapping[str, str]] = None) -> str:
    """The token to present: token, else token_file's contents, else
    KVTIER_TOKEN, else KVTIER_TOKEN_FILE's contents; "" for none. An
    unreadable or empty file is a ValueError naming the file, not the token."""
    env = os.environ if environ is None else environ
    if token:
        return str(token)
    path = token_file or ""
    if not path and env.get("KVTIER_TOKEN"):
        return env["KVTIER_TOKEN"]
    path = path or env.get("KVTIER_TOKEN_FILE", "")
    if not path:
        return ""
    try:
        with open(path, "r", encoding="utf-8") as f:
            value = f.read().rstrip(" \t\r\n")
    except OSError as e:
        raise ValueError(f"kvtier: token file {path}: {e.strerror or e}") from None
    if not value:
        raise ValueError(f"kvtier: token file {path} is empty")
    return value
