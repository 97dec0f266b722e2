"""moto's standalone S3 server on loopback, for the tests that put the store (or MLflow's
artifacts) on an object store: a real HTTP S3 endpoint, in its own process, so a test can
stop it, restart it, or point s3fs and boto3 at it exactly as at AWS."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

START_TIMEOUT_S = 60.0
# moto accepts any credentials; fixed ones keep boto3 from looking for a real profile
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float, process: subprocess.Popen[bytes] | None = None
                  ) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


@dataclass
class S3Server:
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a client process needs to reach this server (boto3, s3fs, MLflow)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint,
                "MLFLOW_S3_ENDPOINT_URL": self.endpoint}

    def start(self) -> S3Server:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **CREDENTIALS})
        wait_for_port(self.port, START_TIMEOUT_S, self.process)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def make_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, **{
            "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": CREDENTIALS["AWS_DEFAULT_REGION"]})
        client.create_bucket(Bucket=name)


@contextmanager
def s3_server_or_skip() -> Iterator[S3Server]:
    """For a fixture: `s3_server()`, or the test skipped, saying why it could not start."""
    import pytest

    try:
        with s3_server() as server:
            yield server
    except (RuntimeError, TimeoutError, OSError) as exc:
        pytest.skip(f"moto's S3 server cannot start here: {exc}")


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server on a free loopback port, stopped on exit (its data with it)."""
    server = S3Server(free_port()).start()
    try:
        yield server
    finally:
        server.stop()
