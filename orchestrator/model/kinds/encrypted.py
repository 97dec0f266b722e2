"""The encrypted kind: an AES-256-GCM blob of another kind (see orchestrator.model.encryption).

Without the key nothing inside can be read, so its summary facts (params, ops) are those
the encrypt stage recorded from the plaintext, kept in memory and in the store's result.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.model.artifact import ModelArtifact
from orchestrator.model.kinds import KeyLookup, payload_codec

NAME = "encrypted"
FILE_NAME = "model.enc"

to_bytes, from_bytes = payload_codec(NAME)


def summary(artifact: ModelArtifact) -> dict[str, Any]:
    facts = artifact.facts or {}
    return {"params": facts.get("params", 0), "ops": facts.get("ops", {})}


def inner(artifact: ModelArtifact, keys: KeyLookup | None) -> ModelArtifact:
    """The artifact inside, decrypted in memory with the key its header names."""
    from orchestrator.model import kinds
    from orchestrator.model.encryption import decrypt, read_header
    from orchestrator.model.keys import KeyMaterialError

    header = read_header(to_bytes(artifact))
    if keys is None:
        raise KeyMaterialError(f"the model is encrypted (key id {header.key_id}) and no key "
                               "was given")
    payload_kind, plaintext = decrypt(to_bytes(artifact), keys(header.key_id).secret)
    signature = json.loads(artifact.signature_json())
    signature["kind"] = payload_kind
    return kinds.load(plaintext, json.dumps(signature))


def runnable(artifact: ModelArtifact, keys: KeyLookup | None = None) -> ModelArtifact:
    """Decrypt in memory, then run the kind inside."""
    from orchestrator.model import kinds
    return kinds.runnable(inner(artifact, keys), keys)


def deployed_graph(artifact: ModelArtifact, keys: KeyLookup | None = None) -> Any:
    """The graph of the kind inside, as the app loads it once decrypted."""
    from orchestrator.model import kinds
    return kinds.deployed_graph(inner(artifact, keys), keys)
