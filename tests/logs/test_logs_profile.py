"""Seed-style per-cycle profile lines (exact values)."""

from __future__ import annotations

from spectrial.logs import parse


def test_verify_line_as_the_investigation_printed_it() -> None:
    r = parse("[2026-01-02 03:04:07 TP0] Target verify: 30.63 ms/cyc ( 96.9%)\n").iloc[0]
    assert (r["engine"], r["kind"], r["phase"], r["verify_ms"], r["verify_pct"], r["timestamp"]) == (
        "profile", "verify", "Target verify", 30.63, 96.9, "2026-01-02 03:04:07")


def test_several_phases_on_one_line_and_without_percent() -> None:
    df = parse("EAGLE3 profile | Draft: 0.52 ms/cyc (2.6%), Target verify: 19.14 ms/cycle (95.3%), "
               "Accept/other: 0.40 ms/cyc\nDraft extend: 1.25 ms/cyc\n")
    assert df[["kind", "phase"]].values.tolist() == [
        ["phase", "Draft"], ["verify", "Target verify"], ["phase", "Accept/other"], ["phase", "Draft extend"]]
    assert df.loc[0, "phase_ms"] == 0.52 and df.loc[0, "phase_pct"] == 2.6
    assert df.loc[1, "verify_ms"] == 19.14 and df.loc[1, "verify_pct"] == 95.3
    assert df.loc[2, "phase_ms"] == 0.4 and df.loc[2, "phase_pct"] != df.loc[2, "phase_pct"]  # NaN: not printed
    assert df["line"].tolist() == [1, 1, 1, 2]
