"""The one exception type of the package."""

from __future__ import annotations

from typing import Optional


class ShoalError(Exception):
    """An error from Shoal, or from talking to it.

    ``message`` is the server's own message when the API answered with an
    error (its JSON body ``{"code", "message"}``), else a sentence saying
    what went wrong (the node unreachable, a certificate the cluster CA did
    not sign, a token refused in clear text, a ``shoal`` command that
    failed). ``status`` is the HTTP status when there was one, and ``code``
    the API's machine-readable error code (``not_found``, ``unauthorized``,
    ...) when it gave one.
    """

    def __init__(
        self,
        message: str,
        status: Optional[int] = None,
        code: Optional[str] = None,
        url: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.url = url

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return "ShoalError(%r, status=%r, code=%r)" % (self.message, self.status, self.code)
