"""`--storage-option KEY=VALUE` on the command line: fsspec options for a URL, parsed and nested."""

from __future__ import annotations

import argparse
import json


def storage_option(text: str) -> tuple[list[str], object]:
    """KEY=VALUE; a dotted KEY nests (client_kwargs.region_name=...); a JSON object/list/bool is decoded.

    Numbers stay strings on purpose: an access key id made of digits must not become an int.
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if value[:1] in ("{", "[") or value in ("true", "false", "null"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{key}: invalid JSON value ({exc.msg})") from None
    return key.split("."), value


def storage_options_of(pairs: list) -> dict | None:
    options: dict = {}
    for keys, value in pairs or []:
        node = options
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return options or None
