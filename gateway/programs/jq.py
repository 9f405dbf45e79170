"""What a jq filter reads and runs (jq 1.6).

jq's language has no way to run a program or write a file. It reads the inputs it is given
(jailed as operands), the environment (`env`, `$ENV`: the sandbox's scrubbed environment), and
modules: `import` and `include` load files found on the module search path (`-L`, `~/.jq`,
`$ORIGIN/../lib/jq`), relative to it or to the importing file, so which file they open is the
module system's to decide. They are refused wherever the word appears, strings and comments
included, so that no misreading of where a string ends can hide one; as are `modulemeta` and
`get_search_list`, which read modules' metadata.
"""

from __future__ import annotations

import re

from gateway.programs.facts import Facts

_REFUSED = {
    "import": "import loads a module file from jq's search path",
    "include": "include loads a module file from jq's search path",
    "modulemeta": "modulemeta reads modules from jq's search path",
    "get_search_list": "get_search_list reads jq's module search path",
}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def analyse(text: str) -> Facts:
    for m in _WORD.finditer(text):
        why = _REFUSED.get(m.group(0))
        if why:
            return Facts(error=f"the jq filter uses {m.group(0)}: {why}")
    return Facts()
