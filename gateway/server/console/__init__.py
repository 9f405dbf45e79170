"""The web console at `/console/` of `gateway serve --http`: the supervisor's approvals inbox,
the reviewer's calls, a call's story, the overview's charts, what-if replay and the chain's
verify status, in a browser or through its JSON API under `/console/api/` (docs/serve.md has
the contract).

- `app.py`: the ASGI app: who may ask (`Console.identify`: a supervisor's secret as a bearer
  token, or a browser session; an agent token gets 403 everywhere), the routes, the answers.
- `sessions.py`: browser sessions (login form, HttpOnly SameSite=Strict cookie, CSRF token).
- `feed.py`: the approvals queue watched once per server, told to every open event stream.
- `auditview.py`: the log read for the timeline of records (each file re-read only when it
  changed), the calls folded for the timeline of calls, a call's page and the overview (only
  what was appended is read), and the chain's verify status, refreshed in the background.
- `fleet.py`: with `--store`, the fleet's inbox (answered with the supervisor's secret, which the
  store checks) and the fleet's ledger for the timeline, calls, overview and verify status.
- `cards.py`: what the pages show, shaped and escaped: an approval's card (what the call runs,
  reads and writes, grouped; the rules, why, the risk), a call's row and story, the overview.
- `static/`: the page, its script and style (no inline script: the CSP forbids it).
"""

from gateway.server.console.app import Console, ConsoleConfig

__all__ = ["Console", "ConsoleConfig"]
