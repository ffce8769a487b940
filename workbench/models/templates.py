"""Chat-template identity: which template an adapter was trained with, and whether the one in
use now is the same.

An adapter learns the exact token layout of its chat template; served or evaluated under
another template it quietly loses accuracy, so training records a fingerprint in the adapter's
manifest and evaluation and serving compare against it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def template_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's chat template (empty template: the hash of "")."""
    tpl = getattr(tokenizer, "chat_template", None) or ""
    return hashlib.sha256(tpl.encode()).hexdigest()[:16]


def fingerprint_warning(adapter: str | Path, tokenizer) -> str | None:
    """A warning when the chat template in use differs from the one the adapter folder's
    manifest records; None when they agree or the adapter records none."""
    manifest = Path(adapter) / "manifest.json"
    if not manifest.exists():
        return None
    trained = json.loads(manifest.read_text()).get("outputs", {}).get(
        "chat_template_fingerprint")
    now = template_fingerprint(tokenizer)
    if trained and trained != now:
        return (f"warning: chat template differs from the one {adapter} was trained with "
                f"({now} != {trained})")
    return None
