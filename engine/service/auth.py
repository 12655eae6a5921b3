"""Who may call the service's API (``arena serve --token`` / ``--tokens-file``): the rule
a token must meet, the tokens file, and what each caller may do.

- ``--token T``: one user, ``operator``, an admin (what the service always had).
- ``--tokens-file FILE``: one line per user, ``USER TOKEN`` or ``USER TOKEN admin``
  (``#`` starts a comment). Every caller may read everything and submit; a job's
  cancel, hold, release and priority need the token of the user who submitted it or an
  admin's; draining a node needs an admin's.
- neither (only on a loopback address): no user at all; anyone who reaches the port
  may do anything (docs/service.md, "Who may do what").

A token is at least ``MIN_TOKEN_CHARS`` visible ASCII characters, of at least two kinds
(lower case, upper case, digits, others) and at least ``MIN_DISTINCT_CHARS`` different
characters: a rule against the short, blank or repeated tokens a person types, not a
measure of entropy (``MAKE_TOKEN`` makes a good one).
"""
from __future__ import annotations

import hashlib
import hmac
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from instances.errors import InputError
from instances.paths import check_input_file

MIN_TOKEN_CHARS = 16
MIN_DISTINCT_CHARS = 8
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(24))'"
SINGLE_USER = "operator"                 # the one user of --token
ADMIN = "admin"                          # the third field of an admin's line in a tokens file
USER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MAX_TOKENS_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the user its token names, and whether an admin."""
    user: str
    admin: bool


def token_chars_problem(token: str) -> str | None:
    """Why ``token`` cannot be a token at all (None: it can): a character that is not
    visible ASCII, which an HTTP header cannot carry either (a newline ended the header).
    Never names the token itself."""
    if not isinstance(token, str) or any(not 33 <= ord(c) <= 126 for c in token):
        return "may hold only visible ASCII characters (no spaces, tabs, line breaks or other characters)"
    return None


def token_problem(token: str) -> str | None:
    """Why ``token`` is refused (None: it meets the rule). Never names the token itself."""
    chars = token_chars_problem(token)
    if chars is not None:
        return chars
    if len(token) < MIN_TOKEN_CHARS:
        return f"is {len(token)} characters long; at least {MIN_TOKEN_CHARS} are needed"
    kinds = sum(any(test(c) for c in token) for test in (str.islower, str.isupper, str.isdigit,
                                                            lambda c: not c.isalnum()))
    if kinds < 2:
        return ("uses one kind of character only; mix at least two of lower case, upper case, digits "
                "and other characters")
    if len(set(token)) < MIN_DISTINCT_CHARS:
        return (f"has {len(set(token))} different characters (a repeated pattern); at least "
                f"{MIN_DISTINCT_CHARS} are needed")
    return None


def check_token(token: str, *, field: str, file: str | None = None, line: int | None = None,
                whose: str = "the token") -> str:
    problem = token_problem(token)
    if problem is not None:
        raise InputError(f"{whose} {problem}; make one with: {MAKE_TOKEN}", file=file, line=line, field=field)
    return token


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case,
    RFC 7235); None when there is none or another scheme."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" else None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class Tokens:
    """The tokens the service accepts, each naming a ``Caller``. Held as SHA-256 digests,
    compared in constant time against every one (the time does not tell which matched)."""

    def __init__(self, callers: dict[str, Caller]):
        if not callers:
            raise ValueError("no tokens")
        self._by_digest = [(_digest(t), c) for t, c in callers.items()]

    @classmethod
    def single(cls, token: str, *, field: str = "--token") -> Tokens:
        """``--token``: one user, ``SINGLE_USER``, an admin."""
        return cls({check_token(token, field=field): Caller(SINGLE_USER, True)})

    @classmethod
    def from_file(cls, path: str | Path, *, field: str = "--tokens-file") -> Tokens:
        """A tokens file: ``USER TOKEN [admin]`` per line; refused (naming the line) when a
        line is malformed, a token breaks the rule, a user or token is repeated, or the file
        can be read or written by others than its owner."""
        p = check_input_file(path, field)
        mode = p.stat().st_mode
        if not stat.S_ISREG(mode):
            raise InputError("not a regular file", file=str(p), field=field)
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InputError(f"its permissions {stat.filemode(mode)} let other users read or change it (a tokens "
                             f"file is a list of passwords): chmod 600 {p}", file=str(p), field=field)
        if p.stat().st_size > MAX_TOKENS_FILE_BYTES:
            raise InputError(f"larger than {MAX_TOKENS_FILE_BYTES} bytes; a tokens file has one short line per user",
                             file=str(p), field=field)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 text (byte {e.start})", file=str(p), field=field) from None
        callers: dict[str, Caller] = {}
        users: dict[str, int] = {}
        seen: dict[bytes, int] = {}
        for n, raw in enumerate(text.splitlines(), start=1):
            words = raw.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) not in (2, 3) or (len(words) == 3 and words[2] != ADMIN):
                raise InputError(f"a line is 'USER TOKEN' or 'USER TOKEN {ADMIN}', got {len(words)} field(s)"
                                 + (f" ending in {words[2]!r}" if len(words) == 3 else ""),
                                 file=str(p), line=n, field=field)
            user, token = words[0], words[1]
            if not USER_RE.match(user):
                raise InputError(f"user {user!r}: 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                                 "or digit", file=str(p), line=n, field=field)
            if user in users:
                raise InputError(f"user {user!r} is already on line {users[user]}", file=str(p), line=n, field=field)
            check_token(token, field=field, file=str(p), line=n, whose=f"the token of user {user!r}")
            d = _digest(token)
            if d in seen:
                raise InputError(f"the token of user {user!r} is the same as line {seen[d]}'s; every user needs "
                                 "their own", file=str(p), line=n, field=field)
            users[user], seen[d] = n, n
            callers[token] = Caller(user, len(words) == 3)
        if not callers:
            raise InputError("no user in it (lines 'USER TOKEN' or 'USER TOKEN admin')", file=str(p), field=field)
        return cls(callers)

    def caller(self, token: str | None) -> Caller | None:
        """The caller ``token`` names (None: no such token)."""
        if token is None:
            return None
        d = _digest(token)
        found = None
        for have, who in self._by_digest:            # every one compared: no early exit
            if hmac.compare_digest(d, have):
                found = who
        return found

    def describe(self) -> str:
        """For the service's log: how many users, how many admins (no names, no tokens)."""
        admins = sum(c.admin for _, c in self._by_digest)
        users = len(self._by_digest)
        return f"{users} user{'s' * (users != 1)}, {admins} admin{'s' * (admins != 1)}"
