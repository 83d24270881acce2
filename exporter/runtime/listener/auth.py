"""Basic authentication as exporter-toolkit does it: bcrypt checks one at a time on their own
thread, verdicts cached by a digest of user, hash and password (a correct scrape costs one
check per password), an unknown user checked against a fake hash so that timing does not tell
which names exist, and at most 32 checks waiting (then the caller answers 503)."""

from __future__ import annotations

import asyncio
import hashlib
from base64 import b64decode
from collections import OrderedDict
from typing import Mapping, Optional, Tuple, Union

from .pool import Pool

AUTH_WAITING = 32  # bcrypt checks allowed to wait; beyond, 503
AUTH_CACHE = 1024
# exporter-toolkit's: a bcrypt hash of "fakepassword", checked for unknown users so that timing
# does not tell which user names exist
_FAKE_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


def basic_credentials(header: str) -> Optional[Tuple[str, bytes]]:
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = b64decode(value.strip(), validate=True)
    except ValueError:
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a password over bcrypt's 72 bytes, or a hash bcrypt refuses
        return False


class BasicAuth:
    """bcrypt checks on one thread, verdicts cached by a digest of (user, hash, password); a check
    already running for the same digest is shared."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._cache: "OrderedDict[bytes, Union[bool, asyncio.Future]]" = OrderedDict()
        self.waiting = 0

    def _key(self, header: str, users: Mapping[str, bytes]) -> Optional[Tuple[bytes, bytes, bytes, bool]]:
        cred = basic_credentials(header) if header else None
        if cred is None:
            return None
        user, password = cred
        hashed = users.get(user)
        known = hashed is not None
        hashed = hashed if known else _FAKE_HASH
        return hashlib.sha256(b"\0".join((user.encode(), hashed, password))).digest(), password, hashed, known

    def cached(self, header: str, users: Mapping[str, bytes]) -> Optional[bool]:
        """The verdict when it needs no bcrypt check (no or unreadable credentials, or cached)."""
        k = self._key(header, users)
        if k is None:
            return False
        hit = self._cache.get(k[0])
        if isinstance(hit, bool):
            self._cache.move_to_end(k[0])
            return hit and k[3]
        return None

    async def check(self, loop: asyncio.AbstractEventLoop, header: str,
                    users: Mapping[str, bytes]) -> Optional[bool]:
        """True, False, or None when too many checks are waiting."""
        k = self._key(header, users)
        if k is None:
            return False
        key, password, hashed, known = k
        hit = self._cache.get(key)
        if isinstance(hit, bool):
            self._cache.move_to_end(key)
            return hit and known
        if hit is None:
            if self.waiting >= AUTH_WAITING:
                return None
            hit = self._pool.submit(loop, _checkpw, password, hashed)
            self._cache[key] = hit
        self.waiting += 1
        try:
            ok = bool(await asyncio.shield(hit))
        except Exception:  # noqa: BLE001
            ok = False
        finally:
            self.waiting -= 1
        self._cache[key] = ok
        while len(self._cache) > AUTH_CACHE:
            self._cache.popitem(last=False)
        return ok and known


