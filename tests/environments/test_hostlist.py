"""SLURM hostlist expansion: the pure parser always, and against real ``scontrol`` if present."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from framework.environments.hostlist import expand_hostlist, parse_hostlist

CASES = [
    ("node01", ["node01"]),
    ("", []),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("n[001-003]", ["n001", "n002", "n003"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[5]", ["n5"]),
    ("x,y[1-3],z", ["x", "y1", "y2", "y3", "z"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("a[1,3-4]-ib", ["a1-ib", "a3-ib", "a4-ib"]),
    ("gpu[1-2],cpu[10-11]", ["gpu1", "gpu2", "cpu10", "cpu11"]),
    ("rack1-n[1-2]", ["rack1-n1", "rack1-n2"]),
    ("n[1,3,5]", ["n1", "n3", "n5"]),
    ("host.dom[1-2]", ["host.dom1", "host.dom2"]),
    ("n[9-11,002]", ["n9", "n10", "n11", "n002"]),
    ("a,a", ["a", "a"]),
]

MALFORMED = ["n[1-2", "n1-2]", "n[]", "n[a-b]", "n[3-1]", "n[1[2]]", "n[1-]", "n[1--3]"]


@pytest.mark.parametrize(("hostlist", "hosts"), CASES)
def test_parse_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert parse_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", MALFORMED)
def test_parse_hostlist_rejects_malformed(hostlist: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        parse_hostlist(hostlist)


def test_expand_hostlist_without_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert expand_hostlist("node[1-2]") == ["node1", "node2"]
    with pytest.raises(ValueError, match=r"unbalanced '\[' in hostlist"):
        expand_hostlist("node[1-2")


def test_expand_hostlist_falls_back_when_scontrol_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: "/nonexistent/scontrol")
    assert expand_hostlist("n[1-3]") == ["n1", "n2", "n3"]


@pytest.mark.slurm
@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol is not installed")
@pytest.mark.parametrize(("hostlist", "hosts"), [case for case in CASES if case[0]])
def test_parser_agrees_with_scontrol(hostlist: str, hosts: list[str]) -> None:
    done = subprocess.run(["scontrol", "show", "hostnames", hostlist],
                          capture_output=True, text=True, timeout=5, check=False)
    if done.returncode != 0 or not done.stdout.split():
        # Slurm 22.05 rejects some forms the parser accepts, e.g. a plain suffix "n[1-2]-ib".
        pytest.skip(f"this scontrol cannot expand {hostlist!r}: {done.stderr.strip()}")
    assert done.stdout.split() == parse_hostlist(hostlist) == hosts
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", MALFORMED)
def test_expand_hostlist_rejects_malformed_even_with_scontrol(hostlist: str) -> None:
    # scontrol itself accepts some of these ("n[1-2" gives "n]"); the parser must not.
    with pytest.raises(ValueError, match="in hostlist"):
        expand_hostlist(hostlist)
