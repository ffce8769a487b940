"""What leaves a site, seen on the wire: every reply's bytes (record names, keys, values,
tensor bytes), counted and searched for the canaries planted in the sites' data and for long
strings. Both tracks' in-process runs audit their replies with it."""

from __future__ import annotations


def wire_payload(msg) -> bytes:
    """Everything a reply carries, as bytes: record names, keys, values and tensor bytes."""
    from flwr.app import ArrayRecord

    parts: list[bytes] = []
    if msg.has_error():
        return (msg.error.reason or "").encode()
    for name, rec in msg.content.items():
        parts.append(name.encode())
        if isinstance(rec, ArrayRecord):
            for k in rec:
                parts += [k.encode(), bytes(rec[k].data)]
        else:
            for k, v in rec.items():
                parts += [str(k).encode(), str(v).encode()]
    return b"\0".join(parts)


class WireAudit:
    """Sees every reply leaving a site: counts bytes, long strings and planted canaries."""

    def __init__(self, canaries: list[str]):
        self.canaries = [c.encode() for c in canaries]
        self.replies = self.leaks = self.long_strings = self.bytes = 0
        self.keys: set[str] = set()

    def __call__(self, msg) -> None:
        from flwr.app import ArrayRecord

        self.replies += 1
        data = wire_payload(msg)
        self.bytes += len(data)
        self.leaks += sum(data.count(c) for c in self.canaries)
        if msg.has_error():
            return
        for name, rec in msg.content.items():
            self.keys.add(name)
            if not isinstance(rec, ArrayRecord):
                self.long_strings += sum(1 for v in rec.values()
                                         if isinstance(v, str) and len(v) > 64)
