"""The audit log's hashing, with no I/O: canonical content, entry hashes, Merkle roots, checkpoints.

Invariants kept here:
- a record's content hash is over a canonical JSON form, so the same stored record always
  hashes the same, and any change to it changes the hash;
- an entry's hash covers its tenant, sequence number, transaction, kind, record id, content
  hash and time, so moving, re-numbering or re-assigning an entry changes it;
- a checkpoint's hash covers the previous checkpoint's, so checkpoints form a chain, and its
  root is the RFC 6962 Merkle tree hash of its entries' hashes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

GENESIS = "0" * 64
_SEQ_BYTES = 8
LEAF_BYTES = _SEQ_BYTES + 32


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot canonicalise {type(value).__name__}")


def _reference(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_encode
    ).encode("utf-8")


# orjson writes what `_reference` writes, byte for byte, except floats from 1e-9 to 1e-4 in
# magnitude: `0.00001` for `1e-05`, `1e-7` for `1e-07`. Output with neither form anywhere is the
# reference's; a string holding one costs the slower encoder, never a different hash. (Two
# searches: one pattern with both alternatives scans the bytes five times slower.)
_SMALL_FIXED = b"0.0000"
_SMALL_EXPONENT = re.compile(rb"e-\d(?!\d)")
# Subclasses, dataclasses, dates and bytes go through `_encode` as they do in the reference;
# what orjson cannot encode as the reference does (integers beyond 64 bits, keys that are not
# strings, lone surrogates, nesting past 254) raises, and the reference decides.
_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)


def canonical(value: Any) -> bytes:
    """The canonical JSON bytes of `value`: sorted keys, no spaces, UTC times.

    Those of `json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`, in
    UTF-8, with times in UTC and bytes in hex; floats are finite (the models refuse the rest).
    """
    try:
        fast = orjson.dumps(value, default=_encode, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return _reference(value)
    if _SMALL_FIXED in fast or _SMALL_EXPONENT.search(fast):
        return _reference(value)
    return fast


def content_sha256(content: Mapping[str, Any]) -> str:
    """The hash a record's content is logged under."""
    return hashlib.sha256(canonical(content)).hexdigest()


@dataclass(frozen=True, slots=True)
class Entry:
    """An audit entry as stored."""

    tenant: str
    seq: int
    xid: int
    kind: str
    record_id: str
    content_sha256: str
    recorded_at: datetime

    def digest(self) -> bytes:
        """The entry's hash: a leaf of its checkpoint's Merkle tree."""
        return hashlib.sha256(
            canonical(
                {
                    "tenant": self.tenant,
                    "seq": self.seq,
                    "xid": self.xid,
                    "kind": self.kind,
                    "record_id": self.record_id,
                    "content_sha256": self.content_sha256,
                    "recorded_at": self.recorded_at,
                }
            )
        ).digest()


def merkle_root(leaves: Sequence[bytes]) -> str:
    """RFC 6962 Merkle tree hash: leaves hashed with 0x00, interior nodes with 0x01."""
    if not leaves:
        return hashlib.sha256(b"").hexdigest()
    level = [hashlib.sha256(b"\x00" + leaf).digest() for leaf in leaves]
    while len(level) > 1:
        paired = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0].hex()


def pack_leaves(entries: Sequence[Entry]) -> bytes:
    """Each entry's sequence number and hash, in order, as a checkpoint stores them."""
    return b"".join(e.seq.to_bytes(_SEQ_BYTES, "big") + e.digest() for e in entries)


def unpack_leaves(packed: bytes) -> list[tuple[int, bytes]]:
    """The (sequence number, hash) pairs a checkpoint stored."""
    return [
        (
            int.from_bytes(packed[i : i + _SEQ_BYTES], "big"),
            packed[i + _SEQ_BYTES : i + LEAF_BYTES],
        )
        for i in range(0, len(packed), LEAF_BYTES)
    ]


def checkpoint_hash(
    *,
    tenant: str,
    number: int,
    previous_hash: str,
    root: str,
    entry_count: int,
    horizon: int,
    first_seq: int,
    last_seq: int,
) -> str:
    """The hash that links a checkpoint to the one before it."""
    return hashlib.sha256(
        canonical(
            {
                "tenant": tenant,
                "number": number,
                "previous_hash": previous_hash,
                "root": root,
                "entry_count": entry_count,
                "horizon": horizon,
                "first_seq": first_seq,
                "last_seq": last_seq,
            }
        )
    ).hexdigest()


@dataclass(frozen=True, slots=True)
class Problem:
    """Where the log stops verifying: the entry (by sequence number) and what is wrong there."""

    seq: int
    problem: str
    kind: str | None = None
    record_id: str | None = None


def compare_sealed(stored: Sequence[tuple[int, bytes]], current: Sequence[Entry]) -> list[Problem]:
    """How the entries a checkpoint sealed differ from the entries now in its range."""
    sealed = dict(stored)
    now = {e.seq: e for e in current}
    problems = [Problem(seq=seq, problem="entry_deleted") for seq in sealed if seq not in now]
    for seq, entry in now.items():
        if seq not in sealed:
            problems.append(Problem(seq, "entry_inserted", entry.kind, entry.record_id))
        elif sealed[seq] != entry.digest():
            problems.append(Problem(seq, "entry_altered", entry.kind, entry.record_id))
    return problems
