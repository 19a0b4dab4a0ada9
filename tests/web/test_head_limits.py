"""The request-head limits and the out-of-descriptors test, on their own."""

from __future__ import annotations

import errno
import sqlite3

from orchestra.web.errors import _out_of_descriptors
from orchestra.web.protocol import FIELD_MAX_BYTES, MAX_FIELDS, head_problem

LINE = b"GET / HTTP/1.1"


def test_head_limits():
    assert head_problem(LINE + b"\r\nHost: x") is None
    assert head_problem(LINE + b"".join(b"\r\nX-%d: 1" % i for i in range(MAX_FIELDS))) is None
    many = LINE + b"".join(b"\r\nX-%d: 1" % i for i in range(MAX_FIELDS + 1))
    assert head_problem(many) == f"The request has more than {MAX_FIELDS} header fields."
    assert head_problem(LINE + b"\r\nX: " + b"a" * (FIELD_MAX_BYTES - 3)) is None
    long_field = LINE + b"\r\nX: " + b"a" * (FIELD_MAX_BYTES - 2)
    assert "longer than 8192 bytes" in head_problem(long_field)
    assert "request line" in head_problem(b"GET /" + b"a" * FIELD_MAX_BYTES + b" HTTP/1.1")


def test_out_of_descriptors_is_read_from_the_whole_chain():
    assert _out_of_descriptors(OSError(errno.EMFILE, "Too many open files"))
    assert _out_of_descriptors(OSError(errno.ENFILE, "File table overflow"))
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as cause:
            raise sqlite3.OperationalError("unable to open database file") from cause
    except sqlite3.OperationalError as wrapped:
        assert _out_of_descriptors(wrapped)
    # Other failures while descriptors are free are not mistaken for it.
    assert not _out_of_descriptors(OSError(errno.ENOSPC, "No space left on device"))
    assert not _out_of_descriptors(ValueError("boom"))


def test_a_malformed_head_is_named_in_a_sentence():
    """Sanic says only "Bad Request" for a head it cannot parse."""
    from sanic import exceptions as sanic_exc

    from orchestra.web.errors import to_orchestra_error

    class _Request:
        method, path = "NONE", "*"

    error = to_orchestra_error(_Request(), sanic_exc.BadRequest("Bad Request"))
    assert (error.status, error.error) == (400, "BadRequestError")
    assert error.message == "The request is not well-formed HTTP/1.1."
    kept = to_orchestra_error(_Request(), sanic_exc.BadRequest("URL may only contain US-ASCII characters."))
    assert kept.message == "URL may only contain US-ASCII characters."
