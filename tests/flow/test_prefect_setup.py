"""What importing the flow (Prefect's first import) does to the process it is imported into."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HOST = textwrap.dedent("""
    import contextlib, io
    import logging as std_logging
    host = io.StringIO()
    with contextlib.redirect_stderr(host):
        from absl import logging  # its handler is made here, as by TensorFlow's first import
    from pipelines import recipe_flow  # Prefect's first import configures logging
    assert not host.closed, "the host's stream was closed"
    handler = logging.get_absl_handler().python_handler
    handler.handle(std_logging.LogRecord("absl", 30, "host.py", 1, "absl line", (), None))
    print("ok")
""")


def test_importing_the_flow_leaves_a_hosts_stderr_open(tmp_path: Path) -> None:
    """Prefect's first import closes every logging handler of the process; absl's closed the
    sys.stderr it was made with (pytest's capture file, a host's redirect_stderr buffer)
    unless that was still sys.stderr. That stream stays open, and absl writes to the
    current stderr."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    done = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert "absl line" in done.stderr, done.stderr[-3000:]
