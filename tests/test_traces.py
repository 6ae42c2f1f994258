"""Request traces (dcost.planning.traces): the public formats read into arrival times and
lengths as their documented schemas define them, and a bad trace refused naming the file, the
line and the field. The fixtures in tests/data/traces follow each schema (README there)."""

import datetime
import pathlib

import numpy as np
import pytest

import dcost
from dcost.planning import traces

DATA = pathlib.Path(__file__).parent / "data" / "traces"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_azure_times_are_seconds_from_the_first_request():
    t = traces.read(DATA / "azure_llm_2023.csv")
    stamps = [
        "2023-11-16 18:15:46.680590",
        "2023-11-16 18:15:46.930590",
        "2023-11-16 18:15:47.000000",
        "2023-11-16 18:15:47.512500",
        "2023-11-16 18:15:48.250000",
        "2023-11-16 18:15:49.000000",
    ]
    when = [datetime.datetime.fromisoformat(s) for s in stamps]
    want = [(w - when[0]).total_seconds() for w in when]
    assert t.arrival == pytest.approx(want, abs=1e-6)
    assert t.prompt.tolist() == [1020, 2210, 640, 4096, 880, 1500]
    assert t.output.tolist() == [180, 95, 310, 20, 240, 64]
    assert t.session is None and t.hash_ids is None and "azure" in t.source


def test_burstgpt_and_mooncake_units():
    b = traces.read(DATA / "burstgpt.csv")
    assert b.arrival.tolist() == [0.0, 0.5, 1.25, 3.0, 4.5]  # seconds, from the first (5 s)
    assert b.prompt.tolist() == [472, 1310, 95, 2048, 700]
    assert b.output.tolist() == [18, 220, 41, 128, 300]
    m = traces.read(DATA / "mooncake.jsonl")
    assert m.arrival.tolist() == [0.0, 2.0, 4.0, 6.5]  # milliseconds in the file
    assert m.hash_ids[1] == (0, 1, 3) and m.hash_block == 512


def test_our_own_format_sorts_and_keeps_sessions(tmp_path):
    t = traces.read(DATA / "sessions.csv")
    assert t.session == ("a", "b", "a", "b", "a")
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"arrival": 2, "prompt": 10, "output": 3}\n\n{"arrival": 1, "prompt": 20, "output": 4}\n'
    )
    j = traces.read(f)
    assert j.arrival.tolist() == [0.0, 1.0] and j.prompt.tolist() == [20, 10]


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        (
            "a.csv",
            AZURE + "2023-11-16 18:15:46.1,10,2\n2023-11-16 18:15:47.0,ten,2\n",
            "line 3: ContextTokens = 'ten'",
        ),
        (
            "b.csv",
            AZURE + "yesterday,10,2\n",
            "line 2: TIMESTAMP = 'yesterday'",
        ),
        (
            "c.csv",
            BURST + "1,GPT-4,10,5,15,API log\n2,GPT-4,10,0,10,API log\n",
            "line 3: Response tokens = '0'",
        ),
        (
            "d.jsonl",
            '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
            '{"timestamp": 5, "output_length": 2}\n',
            "line 2: input_length = None",
        ),
        (
            "e.jsonl",
            '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2, 3]}\n',
            "line 1: hash_ids",
        ),
        ("f.csv", "arrival,prompt,output\n-1,10,2\n", "line 2: arrival = '-1'"),
        ("g.csv", "arrival,prompt,output\n0,10.5,2\n", "line 2: prompt = '10.5'"),
        ("h.csv", "when,tokens\n0,10\n", "line 1: header = 'when,tokens'"),
        ("i.jsonl", '{"arrival": 0, "prompt": 1, "output": 1}\n[1, 2]\n', "line 2: line"),
        ("j.csv", "arrival,prompt,output\n", "has no request"),
    ],
)
def test_a_bad_trace_names_the_file_line_and_field(tmp_path, name, text, where):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(dcost.SpecError, match=name) as err:
        traces.read(f)
    assert where in str(err.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(dcost.SpecError, match="nope.csv: cannot read"):
        traces.read(tmp_path / "nope.csv")


def test_load_from_trace_takes_the_means():
    load = dcost.Load.from_trace(DATA / "burstgpt.csv")
    assert load.prompt == pytest.approx(np.mean([472, 1310, 95, 2048, 700]))
    assert load.total() == 5 and not load.closed
    with pytest.raises(dcost.SpecError, match="Load.clients"):
        dcost.Load(prompt=10, output=10, clients=2, trace=load.trace)
    with pytest.raises(dcost.SpecError, match="Load.shared_prefix"):
        dcost.Load.from_trace(DATA / "burstgpt.csv", shared_prefix=95)
