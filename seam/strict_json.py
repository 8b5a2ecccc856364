"""JSON as RFC 8259 has it: NaN and Infinity are not JSON (browsers' JSON.parse rejects them), so none leaves the
service. A statistic that can be non-finite says why where it is made (e.g. a judgment's interval_note); this is the
guard at every encoder, turning any such float into null."""
from __future__ import annotations

import json
import math


def finite(value):
    """value with every NaN or infinite float, however deep in dicts, lists and tuples, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value, **options) -> str:
    """json.dumps of finite(value), refusing (ValueError) anything else non-finite, e.g. a numpy float's."""
    return json.dumps(finite(value), allow_nan=False, **options)


def loads(text: str):
    """json.loads, with any NaN or Infinity a peer (or an older Governor) wrote read as None."""
    return finite(json.loads(text))
