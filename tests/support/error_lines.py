"""What a clean error report looks like on stderr: one `error: ` line per error, and where
a recipe has several (or a check was deferred), a last line counting them."""

from __future__ import annotations

import re

COUNT_LINE = re.compile(r": \d+ errors?( \(.+\))?$")


def error_lines(stderr: str) -> list[str]:
    """The `error: ` lines of `stderr`, after asserting nothing else is there (no traceback,
    no log line): each error on one line, then at most a count line."""
    lines = stderr.strip().splitlines()
    assert lines and lines[0].startswith("error: "), stderr
    errors = [line for line in lines if line.startswith("error: ")]
    rest = lines[len(errors):]
    assert lines[:len(errors)] == errors, stderr  # the errors come first, together
    assert len(rest) <= 1 and all(COUNT_LINE.search(line) for line in rest), stderr
    if len(errors) > 1:
        assert rest, stderr  # several errors are counted
    return errors
