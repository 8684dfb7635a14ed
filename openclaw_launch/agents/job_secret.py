"""The job's secret: ``OPENCLAW_JOB_SECRET`` when every node has it (then it never travels), else a
random token the first node publishes in the rendezvous's store; as an HMAC key it authenticates the
liveness port (agents/liveness.py) and seals the agents' store values (agents/store.py). Its own
module, below both, so that neither imports the other for it; in no fingerprint (agents/fingerprint.py).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

SECRET_ENV = "OPENCLAW_JOB_SECRET"


@dataclass(frozen=True)
class JobKey:
    """The job's secret as an HMAC key; ``published``: the text to put in the store (None: the
    secret came from ``OPENCLAW_JOB_SECRET`` and never travels)."""

    key: bytes
    published: str | None

    @classmethod
    def of(cls, text: str, published: bool) -> JobKey:
        return cls(hashlib.sha256(b"openclaw job secret\0" + text.encode()).digest(), text if published else None)

    @classmethod
    def for_host(cls, environ: Mapping[str, str]) -> JobKey:
        given = environ.get(SECRET_ENV)
        return cls.of(given, False) if given else cls.of(secrets.token_hex(32), True)

    @classmethod
    def for_member(cls, environ: Mapping[str, str], published: str) -> JobKey:
        """``OPENCLAW_JOB_SECRET`` when set, else what the first node published ("" if nothing)."""
        given = environ.get(SECRET_ENV)
        return cls.of(given, False) if given else cls.of(published, True)
