"""Every secret value the process knows, and scrubbing them out of any text that leaves it.

A secret is scrubbed *by value*: it is registered where it is read (``read_secret_env`` for a
variable a config field names, ``register_secret`` for a token file), and from then on replaced
by ``***`` wherever it appears in a log line, an error, plan output or a report, whatever words
surround it. Shapes of credentials that were never registered (a password in a URL, a bearer
header, ``password=...``) are scrubbed too, and a value found in such a shape is scrubbed
wherever else it appears in the same text (a server that echoes a token back in its error
body repeats it a few words later without the ``Bearer`` in front).

The work is linear in the text: each shape starts at a literal keyword or at the first
character of a scheme (a look-behind keeps it from restarting inside one), its quantifiers are
possessive (nothing is tried twice), and a run a match may scan ends where the next candidate
begins, so no character is scanned by more than a fixed number of attempts. A 64,000-character
error body once took 30 s here (``bench/bench_scrub.py`` prints the figures now).

A config field that expects the *name* of an environment variable and holds something else
(most likely the secret itself, pasted there by mistake) is refused without being echoed.
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from autoscaler.model.errors import InputError

REDACTED = "***"
# Shorter values would mask ordinary words everywhere; a secret that short protects nothing.
MIN_SECRET_CHARS = 4
# Values found in a credential's shape are also cut where they repeat in the same text; each is
# one more pass over the text, so only the longest this many are (every one is still cut where
# its shape is). A text with more is not an error message anyone wrote by hand.
MAX_LEARNED = 32

# The shapes of credentials, each with the secret in group 2. Possessive quantifiers (``*+``,
# ``++``) never give back what they matched; see the module's docstring for why each is linear.
_URL_CREDENTIALS = re.compile(
    # scheme://user:password@ ; the password runs to the last '@' of the authority (as WHATWG
    # URL parsing reads it), which ends at '/', '?', '#' or whitespace, so at the next '://'.
    r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*+://[^:/?#\s@]++:)([^/?#\s]*)(?=@)"
)
_KEYWORDS = r"(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|client[_-]?secret)"
# A value is never the next keyword itself ("Bearer Bearer X" hides X, not the second word).
_NOT_A_KEYWORD = rf"(?!(?:bearer|{_KEYWORDS})\b)"
_BEARER = re.compile(rf"(?i)\b(bearer\s++){_NOT_A_KEYWORD}([A-Za-z0-9._~+/=-]++)")
_KEY_VALUE = re.compile(
    rf"(?i)({_KEYWORDS}[\"']?+\s*+[=:]\s*+[\"']?+){_NOT_A_KEYWORD}([^\s\"',;&]++)"
)
SHAPES = (_URL_CREDENTIALS, _BEARER, _KEY_VALUE)


def _mask(match: re.Match[str]) -> str:
    return match.group(1) + REDACTED


class Secrets:
    """The secret values this process holds, registered where each is read."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._ordered: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def add(self, *values: str | None) -> None:
        with self._lock:
            before = len(self._values)
            for value in values:
                for form in {value, value.strip()} if value else ():
                    if len(form) >= MIN_SECRET_CHARS:
                        self._values.add(form)
            if len(self._values) != before:
                # longest first, so a DSN is cut whole before the password inside it
                self._ordered = tuple(sorted(self._values, key=len, reverse=True))

    def __contains__(self, value: str) -> bool:
        return value in self._values

    def scrub_values(self, text: str) -> str:
        """Only the registered values cut (a few fast passes): for large rendered files whose
        strings were scrubbed whole before rendering."""
        for value in self._ordered:
            if value in text:
                text = text.replace(value, REDACTED)
        return text

    def scrub(self, text: str) -> str:
        """``text`` with every registered value, every value shaped like a credential and
        every repetition of such a value replaced by ``***``."""
        shaped = [match.group(2) for pattern in SHAPES for match in pattern.finditer(text)]
        values = self._ordered
        learned = {value for value in shaped if len(value) >= MIN_SECRET_CHARS} - self._values
        if learned:
            kept = sorted(learned, key=len, reverse=True)[:MAX_LEARNED]
            values = tuple(sorted({*values, *kept}, key=len, reverse=True))
        for value in values:
            if value in text:
                text = text.replace(value, REDACTED)
        if shaped:  # what was too short to scrub by value is still cut where its shape is
            for pattern in SHAPES:
                text = pattern.sub(_mask, text)
        return text


SECRETS = Secrets()


def register_secret(*values: str | None) -> None:
    """Call where a credential is read, before anything can print it."""
    SECRETS.add(*values)
    for value in values:
        if value:
            SECRETS.add(*_passwords_inside(value))


def scrub(text: str) -> str:
    """``text`` without any secret the process knows: for every line that leaves it."""
    return SECRETS.scrub(text)


def scrub_strings(value: Any) -> Any:
    """Every string inside plain data (dicts, lists, tuples) scrubbed, the rest as it is: for
    JSON, so that a secret is cut before escaping could hide it from the text-level scrub."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {scrub_strings(k): scrub_strings(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_strings(item) for item in value]
    return value


def scrubbed_error(exc: InputError) -> InputError:
    """The same error, its message and location scrubbed."""
    field = scrub(exc.field) if exc.field is not None else None
    return InputError(scrub(exc.where), scrub(exc.message), field=field)


_CONNINFO_PASSWORD = re.compile(r"(?i)\bpassword\s*+=\s*+('(?:[^'\\]|\\.)*+'|\S++)")


def _passwords_inside(value: str) -> list[str]:
    """The password of a URL (``postgresql://u:pw@h/db``) or of a libpq key=value DSN
    (``host=db password=pw``), so that it is scrubbed where it appears on its own."""
    found = []
    if "://" in value:
        try:
            password = urllib.parse.urlsplit(value.strip()).password
        except ValueError:
            password = None
        if password:
            found += [password, urllib.parse.unquote(password)]
    for match in _CONNINFO_PASSWORD.finditer(value):
        quoted = match.group(1)
        found += [quoted, quoted.strip("'").replace("\\'", "'").replace("\\\\", "\\")]
    return found


# -- environment variables -------------------------------------------------------------------

_SECRET_NAMES = re.compile(r"(?i)secret|token|passw|credential|private|_dsn$|_key$")
# What a config field naming a variable may hold: letters, digits and underscores, not starting
# with a digit (the same rule as ``autoscaler.model.config``'s), at most 128 characters.
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def register_environment_secrets(environ: Mapping[str, str] | None = None) -> None:
    """Values of environment variables whose names say they are secret (``AWS_SECRET_ACCESS_KEY``,
    ``AZURE_CLIENT_SECRET``, ``GPU_AUTOSCALER_TOKEN``…): long enough to be one, never shown."""
    environ = os.environ if environ is None else environ
    register_secret(*(v for k, v in environ.items() if _SECRET_NAMES.search(k) and len(v) >= 8))


def looks_like_variable_name(text: str) -> bool:
    """An environment variable's name as configs write them (``GPU_AUTOSCALER_TOKEN``), and not
    a random-looking word that is more likely a key pasted in its place: a word (between
    underscores) of 40 or more characters, of 20 or more mixing letters and digits
    (``AKIAIOSFODNN7EXAMPLE``), or mixing capitals, small letters and digits (``16C7e42F``)."""
    if not _VARIABLE_NAME.fullmatch(text):
        return False
    for word in text.split("_"):
        digits = any(c.isdigit() for c in word)
        letters = any(c.isalpha() for c in word)
        cases = any(c.isupper() for c in word) and any(c.islower() for c in word)
        if len(word) >= 40 or (len(word) >= 20 and digits and letters) or (digits and cases):
            return False
    return True


def check_variable_name(name: str, where: str, field: str | None = None) -> str:
    """``name`` when it looks like a variable's name; otherwise an ``InputError`` that does not
    echo it (it is most likely the secret itself, so it is registered as one too)."""
    if looks_like_variable_name(name):
        return name
    register_secret(name)
    raise InputError(
        where,
        "expects the NAME of an environment variable (letters, digits and _, like "
        "GPU_AUTOSCALER_TOKEN), and what is there does not look like one; it is not shown, in "
        "case it is the secret itself: put the value in the environment and its variable's "
        "name here",
        field=field,
    )


def read_secret_env(name: str, where: str, field: str | None = None) -> str:
    """The value of the environment variable ``name`` ("" when unset), registered as a secret
    before anything can print it; a ``name`` that is no variable name is refused unechoed."""
    check_variable_name(name, where, field)
    value = os.environ.get(name, "")
    register_secret(value)
    return value


def register_config_secrets(config: BaseModel | Mapping[str, Any], where: str) -> None:
    """Every ``*_env`` field anywhere in a config (the inbox's token, the journal's DSN, a
    source's bearer token or password, a provider's keys) names a variable holding a secret:
    each name is checked and each value registered, before the first line is printed."""
    data = config.model_dump(mode="python") if isinstance(config, BaseModel) else config
    for field, name in _env_fields(data):
        read_secret_env(name, where, field)


def _env_fields(data: Any) -> Iterator[tuple[str, str]]:
    """(dotted path, value) of each string field whose key ends in ``_env``; iterative, so a
    deeply nested settings block cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                at = f"{path}.{key}" if path else str(key)
                if isinstance(item, str) and str(key).lower().endswith("_env"):
                    yield at, item
                else:
                    stack.append((at, item))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
