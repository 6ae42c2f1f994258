"""Request traces: arrival times, prompt and output lengths, sessions and prefix blocks, read
from the files that public traces and benchmark tools write.

``read(path)`` takes the format from the file's first line:

- **dcost's own** CSV (header ``arrival,prompt,output[,session]``) or JSON Lines
  (``{"arrival": s, "prompt": tokens, "output": tokens[, "session": id]}``): arrival in seconds;
  requests of one session are the turns of a conversation, each later turn's prompt holding the
  earlier turns (prompt and output) as its prefix;
- **Azure LLM inference traces** 2023 and 2024 (Azure/AzurePublicDataset,
  ``AzureLLMInferenceDataset2023.md`` and ``AzureLLMInferenceDataset2024.md``, schema
  ``TIMESTAMP,ContextTokens,GeneratedTokens``): ``TIMESTAMP`` a date and time
  (``2023-11-16 18:15:46.6805900``), the tokens per request;
- **BurstGPT** (HPMLL/BurstGPT README, schema ``Timestamp,Model,Request tokens,Response
  tokens,Total tokens,Log Type``; its third release adds ``Session ID``): ``Timestamp`` in
  seconds from the trace's start; failed requests carry 0 response tokens and are refused here
  (the ``without_fails`` files leave them out);
- **Mooncake** (kvcache-ai/Mooncake ``FAST25-release/README.md``, JSON Lines
  ``{"timestamp", "input_length", "output_length", "hash_ids"}``): ``timestamp`` in
  milliseconds and one hash id per 512-token block of the prompt (the FAST'25 paper's appendix,
  which that README points to); equal hash ids are the same prompt blocks (prefix-cache hits).

Every trace starts at its first request (time 0) and is sorted by arrival. A bad row is refused
naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import math
import pathlib

import numpy as np

from dcost.specs import SpecError

__all__ = ["Trace", "read", "FORMATS", "MOONCAKE_BLOCK"]

FORMATS = ("dcost", "azure", "burstgpt", "mooncake")
MOONCAKE_BLOCK = 512  # tokens a Mooncake hash id stands for (FAST'25 paper, appendix)


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """Requests in arrival order.

    Attributes:
      arrival: seconds from the first request (sorted, first 0).
      prompt, output: tokens per request (whole numbers >= 1).
      session: a session id per request (None where the trace has none); a session's turns
        share the earlier turns as a prefix.
      hash_ids: the prompt's block hashes per request (Mooncake), else None.
      hash_block: tokens per hash id.
      source: the file and its format.
    """

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    session: tuple | None = None
    hash_ids: tuple | None = None
    hash_block: int = MOONCAKE_BLOCK
    source: str = ""

    def __len__(self) -> int:
        return len(self.arrival)


def _fail(path, line, field, value, allowed):
    raise SpecError(f"{path}, line {line}: {field} = {value!r} is not allowed: {allowed}")


def _tokens(path, line, field, value, low=1):
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v) or v != int(v) or v < low:
        _fail(path, line, field, value, f"it must be a whole number of tokens >= {low}")
    return int(v)


def _seconds(path, line, field, value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v) or v < 0:
        _fail(path, line, field, value, "it must be a finite number >= 0")
    return v


def _azure_time(path, line, value):
    """Seconds since the epoch of ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (100 ns ticks allowed)."""
    text = str(value).strip()
    whole, _, frac = text.partition(".")
    try:
        t = datetime.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
        if frac and not frac.isdigit():
            raise ValueError
    except ValueError:
        _fail(path, line, "TIMESTAMP", value, "a date and time like 2023-11-16 18:15:46.6805900")
    stamp = t.replace(tzinfo=datetime.UTC).timestamp()
    return stamp + (int(frac) / 10 ** len(frac) if frac else 0.0)


_CSV = {
    "dcost": ({"arrival", "prompt", "output"}, "arrival,prompt,output[,session]"),
    "azure": (
        {"TIMESTAMP", "ContextTokens", "GeneratedTokens"},
        "TIMESTAMP,ContextTokens,GeneratedTokens",
    ),
    "burstgpt": (
        {"Timestamp", "Request tokens", "Response tokens"},
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    ),
}


def _rows_csv(path, text):
    reader = csv.DictReader(text.splitlines())
    header = set(reader.fieldnames or ())
    kind = next((k for k, (need, _) in _CSV.items() if need <= header), None)
    if kind is None:
        allowed = "; ".join(f"{k}: {h}" for k, (_, h) in _CSV.items())
        _fail(path, 1, "header", ",".join(reader.fieldnames or ()), f"one of {allowed}")
    rows = []
    for i, row in enumerate(reader, start=2):
        if None in row or any(v is None for v in row.values()):
            _fail(path, i, "row", ",".join(str(v) for v in row.values()), "one value per column")
        if kind == "dcost":
            t = _seconds(path, i, "arrival", row["arrival"])
            p = _tokens(path, i, "prompt", row["prompt"])
            o = _tokens(path, i, "output", row["output"])
            s = row.get("session") or None
        elif kind == "azure":
            t = _azure_time(path, i, row["TIMESTAMP"])
            p = _tokens(path, i, "ContextTokens", row["ContextTokens"])
            o = _tokens(path, i, "GeneratedTokens", row["GeneratedTokens"])
            s = None
        else:
            t = _seconds(path, i, "Timestamp", row["Timestamp"])
            p = _tokens(path, i, "Request tokens", row["Request tokens"])
            o = _tokens(path, i, "Response tokens", row["Response tokens"])
            s = row.get("Session ID") or None
        rows.append((t, p, o, s, None))
    return kind, rows


def _rows_jsonl(path, text):
    rows: list[tuple] = []
    kind = None
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            _fail(path, i, "line", raw[:60], f"a JSON object ({err.msg})")
        if not isinstance(obj, dict):
            _fail(path, i, "line", raw[:60], "a JSON object")
        if kind is None:
            kind = "mooncake" if "input_length" in obj else "dcost"
        if kind == "mooncake":
            for f in ("timestamp", "input_length", "output_length"):
                if f not in obj:
                    _fail(
                        path,
                        i,
                        f,
                        None,
                        "Mooncake rows need timestamp, input_length, output_length",
                    )
            t = _seconds(path, i, "timestamp", obj["timestamp"]) * 1e-3
            p = _tokens(path, i, "input_length", obj["input_length"])
            o = _tokens(path, i, "output_length", obj["output_length"])
            h = obj.get("hash_ids", [])
            if not isinstance(h, list) or len(h) > math.ceil(p / MOONCAKE_BLOCK):
                _fail(
                    path,
                    i,
                    "hash_ids",
                    h,
                    f"a list of at most ceil(input_length / {MOONCAKE_BLOCK}) block hashes",
                )
            rows.append((t, p, o, None, tuple(h)))
        else:
            for f in ("arrival", "prompt", "output"):
                if f not in obj:
                    _fail(path, i, f, None, "dcost rows need arrival (s), prompt, output")
            t = _seconds(path, i, "arrival", obj["arrival"])
            p = _tokens(path, i, "prompt", obj["prompt"])
            o = _tokens(path, i, "output", obj["output"])
            rows.append((t, p, o, obj.get("session"), None))
    return kind or "dcost", rows


def read(path) -> Trace:
    """The requests of a trace file (format from its first line; see the module docstring).

    Args:
      path: a CSV or JSON Lines file.

    Returns:
      ``Trace``, sorted by arrival, the first at 0 s.

    Raises:
      SpecError: naming the file, the line and the field of the first bad row.

    >>> import pathlib, tempfile
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = f.write_text("arrival,prompt,output\\n0.5,100,10\\n0.0,200,20\\n")
    >>> t = read(f)
    >>> t.arrival.tolist(), t.prompt.tolist()
    ([0.0, 0.5], [200, 100])
    """
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"{p}: cannot read the trace ({err.strerror})") from None
    head = text.lstrip()[:1]
    kind, rows = _rows_jsonl(p, text) if head == "{" else _rows_csv(p, text)
    if not rows:
        raise SpecError(f"{p}: the trace has no request")
    order = sorted(range(len(rows)), key=lambda k: rows[k][0])
    t = np.array([rows[k][0] for k in order], float)
    sessions = [rows[k][3] for k in order]
    hashes = [rows[k][4] for k in order]
    return Trace(
        arrival=t - t[0],
        prompt=np.array([rows[k][1] for k in order], int),
        output=np.array([rows[k][2] for k in order], int),
        session=tuple(None if s is None else str(s) for s in sessions)
        if any(s is not None for s in sessions)
        else None,
        hash_ids=tuple(hashes) if kind == "mooncake" else None,
        source=f"{p.name} ({kind})",
    )
