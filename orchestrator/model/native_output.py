"""Hold back what native code prints while it runs.

TFLite's converter prints its calibration settings ("fully_quantize: 0, inference_type: 6
...") and MLIR notes from C++ straight to file descriptor 2, past Python's sys.stderr:
they would scroll through the user's console between progress lines. For the duration
of the call, fds 1 and 2 point at a temporary file; what was caught is returned, for the
caller to log at debug level. Progress lines are printed between stages, never during
one, so none is lost.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()  # two threads swapping the fds at once would lose them
_STREAMS = (1, 2)


@contextlib.contextmanager
def native_output_held(caught: list[str]) -> Iterator[None]:
    """Within: fds 1 and 2 write to a temporary file; after: `caught` gets its lines."""
    with _LOCK, tempfile.TemporaryFile(mode="w+b") as sink:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.flush()
        saved = [os.dup(fd) for fd in _STREAMS]
        for fd in _STREAMS:
            os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(AttributeError, ValueError, OSError):
                    stream.flush()
            for fd, copy in zip(_STREAMS, saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            caught.extend(sink.read().decode(errors="replace").splitlines())
