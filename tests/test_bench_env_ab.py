"""bench/env_ab.py: metric paths, and a run end to end whose two settings must differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from env_ab import parse_env, pick  # noqa: E402

DOC = {"levels": [{"clients": 1, "tok": 5.0}, {"clients": 256, "tok": 7.5}],
       "summary": {"tok": {"median": 3.0}}, "probes": [{"identical": True}]}


def test_pick_walks_keys_indices_and_selectors() -> None:
    assert pick(DOC, "summary.tok.median") == 3.0
    assert pick(DOC, "levels.clients=256.tok") == 7.5
    assert pick(DOC, "levels.0.tok") == 5.0
    assert pick(DOC, "probes.0.identical") is True
    with pytest.raises(KeyError, match="clients = 64"):
        pick(DOC, "levels.clients=64.tok")
    with pytest.raises(KeyError, match="'nope'"):
        pick(DOC, "summary.nope")


def test_parse_env_refuses_items_without_a_name_and_value() -> None:
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("A", "=1"):
        with pytest.raises(SystemExit, match="NAME=VALUE"):
            parse_env([bad])


def test_a_run_alternates_settings_and_pairs_the_rounds(tmp_path: Path) -> None:
    # The "bench" writes the setting it saw, so the pairing and the order are visible.
    bench = ("import json, os, sys; "
             "json.dump({'v': float(os.environ['EAB_V'])}, open(sys.argv[1], 'w'))")
    out = tmp_path / "ab.json"
    subprocess.run([sys.executable, str(BENCH / "env_ab.py"), "--a", "EAB_V=2", "--b", "EAB_V=3",
                    "--rounds", "3", "--metric", "v", "--json", str(out), "--",
                    sys.executable, "-c", bench, "{json}"], check=True, capture_output=True)
    doc = json.loads(out.read_text())
    assert [r["v"] for r in doc["runs"]["a"]] == [2.0, 2.0, 2.0]
    assert [r["v"] for r in doc["runs"]["b"]] == [3.0, 3.0, 3.0]
    assert doc["ratio_b_over_a"]["v"]["per_round"] == [1.5, 1.5, 1.5]
    logs = sorted(p.name for p in (tmp_path / "ab").glob("*.json"))
    assert logs == ["a0.json", "a1.json", "a2.json", "b0.json", "b1.json", "b2.json"]


def test_a_missing_figure_fails_the_run(tmp_path: Path) -> None:
    bench = "import json, sys; json.dump({}, open(sys.argv[1], 'w'))"
    res = subprocess.run([sys.executable, str(BENCH / "env_ab.py"), "--rounds", "1",
                          "--metric", "v", "--json", str(tmp_path / "x.json"), "--",
                          sys.executable, "-c", bench, "{json}"], capture_output=True, text=True)
    assert res.returncode == 1 and "no 'v'" in res.stderr


def test_drop_runs_keeps_only_the_summary_unless_a_run_failed(tmp_path: Path) -> None:
    good = "import json, sys; json.dump({'v': 1.0}, open(sys.argv[1], 'w'))"
    bad = "import json, sys; json.dump({}, open(sys.argv[1], 'w'))"
    for name, bench, rc in (("ok", good, 0), ("bad", bad, 1)):
        res = subprocess.run([sys.executable, str(BENCH / "env_ab.py"), "--rounds", "1",
                              "--metric", "v", "--json", str(tmp_path / f"{name}.json"),
                              "--drop-runs", "--", sys.executable, "-c", bench, "{json}"],
                             capture_output=True, text=True)
        assert res.returncode == rc, res.stderr
        assert (tmp_path / f"{name}.json").exists()
        assert (tmp_path / name).exists() == (rc != 0)  # kept only for the failed one


def test_each_side_may_run_in_a_tree_of_its_own(tmp_path: Path) -> None:
    # Two "trees" whose bench/x.py report different figures: a side's relative command must
    # run its own tree's file, and {json} must land in the one work folder either way.
    for name, v in (("tree_a", 1.0), ("tree_b", 4.0)):
        (tmp_path / name / "bench").mkdir(parents=True)
        (tmp_path / name / "bench" / "x.py").write_text(
            f"import json, sys; json.dump({{'v': {v}}}, open(sys.argv[1], 'w'))")
    out = tmp_path / "ab.json"
    subprocess.run([sys.executable, str(BENCH / "env_ab.py"), "--a-cwd", str(tmp_path / "tree_a"),
                    "--b-cwd", str(tmp_path / "tree_b"), "--rounds", "2", "--metric", "v",
                    "--json", str(out), "--", sys.executable, "bench/x.py", "{json}"],
                   check=True, capture_output=True, cwd=tmp_path)
    doc = json.loads(out.read_text())
    assert [r["v"] for r in doc["runs"]["a"]] == [1.0, 1.0]
    assert [r["v"] for r in doc["runs"]["b"]] == [4.0, 4.0]
    assert doc["ratio_b_over_a"]["v"]["per_round"] == [4.0, 4.0]
    assert doc["cwd"] == {"a": str(tmp_path / "tree_a"), "b": str(tmp_path / "tree_b")}
    res = subprocess.run([sys.executable, str(BENCH / "env_ab.py"), "--a-cwd",
                          str(tmp_path / "missing"), "--metric", "v", "--json", str(out), "--",
                          sys.executable, "bench/x.py", "{json}"], capture_output=True, text=True)
    assert res.returncode != 0 and "not a directory" in res.stderr
