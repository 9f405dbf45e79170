"""The web console at `/console/` of `gateway serve --http`: the supervisor's approvals inbox,
the reviewer's audit timeline and the chain's verify status, in a browser or through its JSON
API under `/console/api/` (docs/serve.md has the contract).

- `app.py`: the ASGI app: who may ask (`Console.identify`: a supervisor's secret as a bearer
  token, or a browser session; an agent token gets 403 everywhere), the routes, the answers.
- `sessions.py`: browser sessions (login form, HttpOnly SameSite=Strict cookie, CSRF token).
- `feed.py`: the approvals queue watched once per server, told to every open event stream.
- `auditview.py`: the log read for the timeline (each file re-read only when it changed) and
  the chain's verify status, refreshed in the background at most every few seconds.
- `static/`: the page, its script and style (no inline script: the CSP forbids it).
"""

from gateway.server.console.app import Console, ConsoleConfig

__all__ = ["Console", "ConsoleConfig"]
