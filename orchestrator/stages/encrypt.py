"""Encrypt the model with AES-256-GCM (docs/formats.md has the format byte by byte).

Any kind can be encrypted, a memmapped package included; the app decrypts it in memory with
its platform's own AES-GCM. The key is 32 bytes, as base64 or hex, from the environment
variable `key_env` (default ORCHESTRATOR_MODEL_KEY) or from `key_file` (relative to the
recipe); `orchestrator keygen` makes one. The key never appears in params, logs, MLflow,
report.json or the cache key: only its key id (the first 8 bytes of its SHA-256, hex) does,
and the key id is part of the cache key, so a cached result is never served for another key.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.errors import StageError
from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.encryption import PAYLOAD_KINDS
from orchestrator.model.keys import DEFAULT_ENV
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult


class Params(StageParams):
    # Where the key is, not the key: the plan loads it and puts its key id in the cache key.
    NOT_IN_KEY = frozenset({"key_env", "key_file"})

    key_env: str = Field(DEFAULT_ENV, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                         description="Environment variable holding the key (base64 or hex).")
    key_file: str | None = Field(
        None, description="File holding the key (base64 or hex), relative to the recipe; "
        "wins over key_env. Keep it out of version control.")


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model import kinds
    from orchestrator.model.encryption import HEADER_BYTES, decrypt, encrypt

    if ctx.model_key is None:
        raise StageError("encrypt needs a model key and the runner gave none",
                         pipeline=ctx.pipeline, stage=ctx.stage)
    key = ctx.model_key(None)
    plaintext = kinds.to_bytes(artifact)
    blob = encrypt(plaintext, artifact.kind, key.secret)
    if decrypt(blob, key.secret) != (artifact.kind, plaintext):  # round trip, in memory
        raise StageError("the encrypted model does not decrypt to the original",
                         pipeline=ctx.pipeline, stage=ctx.stage)
    inner = kinds.facts(artifact)
    encryption = {"algorithm": "AES-256-GCM", "format_version": 1, "key_id": key.key_id,
                  "payload_kind": artifact.kind, "header_bytes": HEADER_BYTES}
    result = artifact.replace(graph_def=None, kind="encrypted", payload=blob,
                              metadata={"encryption": encryption},
                              facts={"params": inner["params"], "ops": inner["ops"]})
    info = {**encryption, "key_source": key.source, "plaintext_bytes": len(plaintext),
            "encrypted_bytes": len(blob)}
    return StageResult(artifact=result, info={"encryption": info},
                       metrics={"encrypted_bytes": float(len(blob))})


STAGE = register(Stage(name="encrypt", run=run, params=Params, doc=__doc__,
                       accepts=frozenset(PAYLOAD_KINDS.values()), produces="encrypted",
                       uses_key=True))
