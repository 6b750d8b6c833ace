"""pdkv's status codes, as Python sees them: a failed call raises PdkvError."""

import enum

from pdkv._native import lib


class StatusCode(enum.IntEnum):
    """The numbers of pdkv_status (pdkv/pdkv.h) and pdkv::StatusCode."""
    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_RANGE = 2
    NOT_FOUND = 3
    ALREADY_EXISTS = 4
    FAILED_PRECONDITION = 5
    UNAVAILABLE = 6
    DEADLINE_EXCEEDED = 7
    ABORTED = 8
    INTERNAL = 9
    UNAUTHENTICATED = 10
    RESOURCE_EXHAUSTED = 11


class PdkvError(Exception):
    """A pdkv call failed: `code` (a StatusCode) and the library's message."""

    def __init__(self, code, message):
        self.code = StatusCode(code)
        self.message = message
        super().__init__(f"{self.code.name.lower()}: {message}")


def last_error_message():
    return lib.pdkv_last_error().decode("utf-8", "replace")


def check(status):
    """Raises PdkvError for a non-OK status, with this thread's last error."""
    if status != StatusCode.OK:
        raise PdkvError(status, last_error_message())
