"""The fleet's store: what many gateways share, kept in PostgreSQL (`--store postgresql://...`,
or `AGW_STORE`). Without it the gateway keeps its files, as it always has (docs/fleet.md).

- db.py          `Store`: the connection pool, errors that name the store, the schema's versions
                 (`gateway store init|migrate|status`); the SQL is in migrations/, in order
- ledger.py      `StoreLedger`: the audit log as one hash chain per gateway process (a stream),
                 each record committed before its call runs; `verify_store` checks every stream
- sequencer.py   one elected gateway folds the streams' heads into signed checkpoints
- approvals.py   `StoreApprover`: asks as rows, woken by LISTEN, re-read after every reconnect
- tokens.py      bearer tokens as rows, revocable fleet-wide
- policy.py      signed policy revisions: `gateway policy publish --store`, taken by every gateway
- reader.py      the audit readers (`audit tail|show|query|calls --store`) over every stream
- commands.py    the CLI verbs (`gateway store ...`, `audit verify --store`, `approvals --store`)

Layers (pyproject.toml's `store` and `store-ledger` contracts, docs/architecture.md): the package
sits under the faces that choose it and over the gate. Inside it, db.py imports nothing of the
gateway; ledger.py, sequencer.py and reader.py import only the audit log and the shared values
(the gate reaches the ledger through the AuditSink seam, never by name); approvals.py, policy.py
and tokens.py use the gate's approver and decisions and the shared tokens (gateway/tokens.py);
commands.py, on top, is what the CLI and the faces call. This file imports none of them.
"""
