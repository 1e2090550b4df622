"""Text the database and JSON cannot carry: lone surrogates and NUL, refused on input and replaced on output.

JSON may spell any UTF-16 code unit (`"\\udc80"`, `"\\u0000"`), so a parsed
body can hold strings that UTF-8 cannot encode (a lone surrogate) or that
Postgres refuses (NUL). Stored, such a string breaks every later response
that includes it. Input is checked once, where the API parses JSON
(`common.api.parsers.JSONParser`); output that meets such a string anyway
(a row stored before the check) shows U+FFFD instead (`replace_unencodable`).
"""

from __future__ import annotations

import re
from typing import Any

# A surrogate code point on its own (Python keeps the pair of a valid one as one character), or NUL.
_UNSTORABLE = re.compile("[\ud800-\udfff\x00]")

UNSTORABLE_MESSAGE = "Contains a character that cannot be stored (a NUL or a lone UTF-16 surrogate)."


def is_storable(text: str) -> bool:
    """Whether `text` can be stored and sent as UTF-8 as it is."""
    return _UNSTORABLE.search(text) is None


def unstorable_paths(data: Any, prefix: str = "") -> list[str]:
    """Return the dotted path of every string (or object key) in parsed JSON `data` that is not storable.

    As the API names fields everywhere: list items by index (`command[1]`, `items[1].command[0]`), object
    members by key (`env.HOME`); a bad key is named by its object's path. Iterative: depth costs no recursion.
    """
    found: list[str] = []
    stack: list[tuple[str, Any]] = [(prefix, data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not is_storable(value):
                found.append(path)
        elif isinstance(value, dict):
            for key, child in value.items():
                if not is_storable(key):
                    found.append(path or "non_field_errors")
                    continue
                stack.append((f"{path}.{key}" if path else key, child))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", child) for index, child in enumerate(value))
    return sorted(set(found))


def replace_unencodable(text: str) -> str:
    """Return `text` with its lone surrogates as U+FFFD, so it always encodes as UTF-8 (NUL is kept)."""
    if is_storable(text.replace("\x00", "")):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
