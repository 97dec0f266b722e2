"""orchestrator: declarative recipes that turn trained TensorFlow models into device-ready files."""

__version__ = "0.1.0"

import os as _os

# Before TensorFlow is first imported anywhere: quiet its C++ banner, and keep oneDNN's
# reordered float math out of before/after comparisons.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def load_encrypted(path: str | _os.PathLike[str], key: bytes | str,
                   signature: str | _os.PathLike[str] | None = None) -> object:
    """Decrypt an encrypted model in memory into a runnable ModelArtifact, or the bytes of
    a .tflite for LiteRT's Interpreter(model_content=...) (see
    orchestrator.model.encryption.load_encrypted); the plaintext never touches the disk."""
    from orchestrator.model.encryption import load_encrypted as _load

    return _load(path, key, signature)
