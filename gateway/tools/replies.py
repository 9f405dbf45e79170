"""What the tool families share of their replies (not a family itself): an output stream over
`limits.reply_bytes` is cut to its head and tail, and the whole of it saved where the files tool
lets its principal read it (`saved_outputs_dir`). run, session and process replies use it; the
files tool reads the saved copies."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.pipeline import Gateway


DEFAULT_REPLY_BYTES = 30_000
"""Bytes of each output stream a `run` reply carries at most (`limits.reply_bytes`)."""
HEAD_SHARE = 10
"""A cut stream keeps its first 1/HEAD_SHARE and its tail: the end is what an agent needs most."""
KEEP_SAVED = 64
"""Saved outputs kept per principal (the oldest go first)."""


def fit_reply(
    gw: Gateway, principal: str, call_id: str, outcome: dict[str, Any], limit: int,
    streams: tuple[str, ...] = ("stdout", "stderr"),
) -> dict[str, Any]:  # fmt: skip
    """Cut each output stream (`streams`: the outcome's text fields) over `limit` bytes to its
    head and a longer tail, and say so in `notice`: how much was left out, and where the whole of
    it (as the executor kept it, within `limits.output_bytes`) is saved for the files tool. The
    saved copy lives in the gateway's own state (`outputs/PRINCIPAL/`), which no sandbox sees and
    only the gateway writes; the files tool lets that principal, and no other, read it. Without a
    state directory nothing is saved. Used by run, session (exec, write, read) and process
    (output) replies."""
    cut = [k for k in streams if isinstance(outcome.get(k), str) and len(outcome[k].encode()) > limit]
    if not cut:
        return outcome
    outcome = dict(outcome)
    where = saved_outputs_dir(gw, principal)
    notes = []
    for k in cut:
        data = outcome[k].encode()
        saved = _save(where, f"{call_id}.{k}.txt", data) if where is not None else None
        head = limit // HEAD_SHARE
        tail = limit - head
        left_out = len(data) - head - tail
        outcome[k] = (
            data[:head].decode("utf-8", "ignore")
            + f"\n[... {left_out} bytes of {k} not shown ...]\n"
            + data[-tail:].decode("utf-8", "ignore")
        )
        outcome.setdefault("reply_cut", {})[k] = {"bytes": len(data), "shown": head + tail, "saved": saved}
        how = (
            f"the whole of it is in {saved}: files read with path {saved!r} (offset/limit in lines, "
            "or max_bytes), or files grep there"
            if saved
            else "nothing was saved (the gateway has no state directory): rerun with the output "
            "redirected to a file in the workspace, or piped through tail/grep"
        )
        notes.append(f"{k}: {len(data)} bytes, {left_out} not shown (the first {head} and last {tail} are); {how}")
    dropped = outcome.get("dropped_bytes") or {}
    if isinstance(dropped, int):  # a session's one stream
        dropped = {cut[0]: dropped}
    if any(dropped.get(k) for k in cut):
        kept = "the last" if isinstance(outcome.get("dropped_bytes"), int) else "the first and last"
        notes.append(
            f"the executor kept {kept} limits.output_bytes of each stream; "
            f"what it dropped ({', '.join(f'{k}: {dropped[k]}' for k in cut if dropped.get(k))}) is gone"
        )
    notice = "; ".join(notes)
    outcome["notice"] = f"{outcome['notice']}; {notice}" if outcome.get("notice") else notice
    return outcome


def _save(where: Path, name: str, data: bytes) -> str | None:
    """Write `data` to `where/name` (the gateway's own directory, mode 0700), keep the newest
    KEEP_SAVED files there. Returns the path, or None when it could not be written."""
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = where / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        kept = sorted(where.iterdir(), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[KEEP_SAVED:]:
            with contextlib.suppress(OSError):
                old.unlink()
        return str(path)
    except OSError:
        return None


def saved_outputs_dir(gw: Gateway, principal: str) -> Path | None:
    """Where the gateway keeps `principal`'s saved outputs (None: it runs without a state dir)."""
    return gw.state_dir / "outputs" / principal if gw.state_dir is not None else None
