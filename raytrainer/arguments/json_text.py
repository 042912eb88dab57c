"""The one parser of JSON-object text: a dict argument written as text (on the command line, in a config file,
or passed as a str), for `TrainingArguments`' dict fields (normalise.py), `fsdp_config` (fsdp_config.py) and the
argument parser's dict options (parser.py).

Blank text means unset (None). Anything that is not a JSON object is a `ConfigError` in one shape, naming the
field and its value when the caller gives the field, and saying what to write (the caller's example).
"""

from __future__ import annotations

import json
from typing import Optional

from ..errors import ConfigError

EXAMPLE = "a JSON object such as '{\"key\": 1}'"


def parse_json_object(text: str, field: str = "", *, example: str = EXAMPLE, shown: Optional[str] = None) \
        -> Optional[dict]:
    """`text` as a dict, or None when it is blank.

    field: the argument's name, put in front of the message with its value (`shown`, else the text itself):
        "lr_scheduler_kwargs='{x' is not valid JSON (...); write ...". Without it the message starts at
        "not valid JSON", for a caller that names the argument itself (argparse: "argument --x: ...").
    example: what to write instead, after "write ".
    """
    if not text.strip():
        return None
    subject = f"{field}={repr(text) if shown is None else shown} " if field else ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{subject}{'is ' if subject else ''}not valid JSON ({e}); write {example}.") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{subject}must be a JSON object (a dict).")
    return value
