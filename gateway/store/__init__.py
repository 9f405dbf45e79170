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

Layers: db.py imports nothing of the gateway; ledger.py, sequencer.py and reader.py sit with the
audit log; approvals.py and policy.py with the gate; tokens.py and commands.py with the faces.
This file imports none of them.
"""
