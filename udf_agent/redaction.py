"""Secrets are never written: a setting whose name says it holds a secret, password, token or
key is shown as ``REDACTED`` wherever settings are shown (logs, status, errors), and so is
such a parameter of a Spark Connect URL (``sc://host:15002/;token=...``)."""

from __future__ import annotations

import re

REDACTED = "*********(redacted)"
# Spark's own spark.redaction.regex is (?i)secret|password|token|access[.]?key; any key too
# (spark.ssl.keyPassword, a keystore's key, fs.s3a.secret.key, an API key).
SECRET_NAME = re.compile(r"secret|password|passwd|token|key|credential", re.IGNORECASE)
# A Spark Connect URL's parameters: ;name=value after the host.
_URL_PARAMETER = re.compile(r";([^;=/]+)=([^;]*)")


def is_secret(name: str) -> bool:
    return SECRET_NAME.search(name) is not None


def redacted_value(name: str, value: object) -> object:
    return REDACTED if is_secret(name) else value


def redacted_url(url: str) -> str:
    """``url`` with the value of each parameter naming a secret replaced (``;token=...``)."""
    return _URL_PARAMETER.sub(lambda m: f";{m.group(1)}={redacted_value(m.group(1), m.group(2))}", url)
