"""The soak scripts' arithmetic and reports (scripts/soak_common.py, scripts/soak_broker.py,
tests/delivery.py), on made-up samples: the runs themselves take minutes to an hour."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.delivery import as_ranges, count_delivery, seqs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import soak_broker
from soak_common import growth_per_hour, replace_section, value_range, write_section


@dataclass
class _Message:
    payload: bytes


def test_seqs_read_from_payloads_in_arrival_order() -> None:
    assert seqs([_Message(json.dumps({"seq": n}).encode()) for n in (2, 1, 3)]) == [2, 1, 3]


def test_delivery_counts_missing_duplicates_and_out_of_order() -> None:
    delivery = count_delivery([1, 2, 5, 3, 3, 7], produced=8)
    assert delivery.produced == 8
    assert delivery.received == 5
    assert delivery.missing == [4, 6, 8]  # 8: made, never arrived (the tail counts too)
    assert delivery.lost == 3
    assert delivery.duplicates == 1
    assert delivery.out_of_order == 1  # 5 -> 3; the duplicate 3 -> 3 is not lower
    assert count_delivery([3, 1, 2]).produced == 3  # without the agent's count: the highest seen
    assert count_delivery([]).lost == 0


def test_missing_seqs_read_as_ranges() -> None:
    assert as_ranges([9, 3, 4, 5, 11, 12]) == "3-5, 9, 11-12"
    assert as_ranges([]) == ""


def test_growth_is_fitted_over_the_second_half_only() -> None:
    # Warm-up in the first half (a jump), flat in the second: no growth.
    rows = [{"t_s": t * 10.0, "rss": 100.0 if t < 50 else 150.0} for t in range(100)]
    assert growth_per_hour(rows, "rss") == pytest.approx(0.0, abs=1e-9)
    # 1 MB per 360 s in the second half = 10 MB per hour.
    rows = [{"t_s": t * 10.0, "rss": t / 36.0} for t in range(100)]
    assert growth_per_hour(rows, "rss") == pytest.approx(10.0)
    assert math.isnan(growth_per_hour(rows[:4], "rss"))
    assert value_range(rows[:3], "rss") == f"0.0 to {2 / 36.0}"
    assert value_range(rows, "absent") == "-"


def test_a_script_replaces_only_its_own_section() -> None:
    document = "<!-- a -->\nold a\n<!-- /a -->\n\n<!-- b -->\nb text\n<!-- /b -->\n"
    updated = replace_section(document, "a", "new a\n")
    assert updated == "<!-- a -->\nnew a\n<!-- /a -->\n\n<!-- b -->\nb text\n<!-- /b -->\n"
    appended = replace_section("<!-- b -->\nb text\n<!-- /b -->", "a", "a text")
    assert appended == "<!-- b -->\nb text\n<!-- /b -->\n\n<!-- a -->\na text\n<!-- /a -->\n"
    assert replace_section("", "a", "x") == "<!-- a -->\nx\n<!-- /a -->\n"
    with pytest.raises(ValueError, match="no <!-- /a -->"):
        replace_section("<!-- a -->\nunclosed\n", "a", "x")


def test_write_section_keeps_the_other_scripts_text(tmp_path: Path) -> None:
    path = tmp_path / "soak.md"
    write_section(path, "soak_sources", "sources report")
    write_section(path, "soak_broker", "broker report 1")
    write_section(path, "soak_broker", "broker report 2")
    text = path.read_text()
    assert "sources report" in text and "broker report 2" in text and "broker report 1" not in text
    assert text.index("soak_sources") < text.index("soak_broker")


def test_bounces_fit_inside_the_run() -> None:
    assert soak_broker.bounce_offsets(60, 300, 5) == [300.0 * k for k in range(1, 12)]
    assert soak_broker.bounce_offsets(4, 60, 5) == [60.0, 120.0]
    assert soak_broker.bounce_offsets(1, 300, 5) == []


def _run(lost: list[int]) -> dict[str, Any]:
    rows = [
        {"t_s": 10.0 * i, "rss_mb": 400.0 + (3.0 if i > 5 else 0.0), "fds": 14, "threads": 14,
         "results": 100 * i, "received": 100 * i, "pending": 0}
        for i in range(1, 37)
    ]  # fmt: skip
    arrivals = [n for n in range(1, 3601) if n not in lost] + [7]
    return {
        "rows": rows,
        "bounces": [
            {"at_s": 60.0, "stop_took_s": 0.1, "down_s": 5.0, "new_after_s": 0.4, "live_after_s": 0.9},
            {"at_s": 120.0, "stop_took_s": 0.1, "down_s": 5.0},  # never delivered again
        ],
        "delivery": count_delivery(arrivals, 3600),
        "produced": 3600,
        "acked": 3600,
        "outbox": {"dropped": 0, "pending": 0},
        "exit_code": 0,
        "errors": [
            "2026-11-26 04:17:17,255 ERROR agent.mqtt.connection.paho: failed to receive on socket",
            "2026-11-26 04:18:17,255 ERROR agent.mqtt.connection.paho: failed to receive on socket",
        ],
    }


def test_report_states_the_numbers_and_the_verdict() -> None:
    args = argparse.Namespace(minutes=6.0, bounce_every_s=60.0, down_s=5.0, fps=10.0, warmup_minutes=10.0)
    text = soak_broker.report(args, _run(lost=[]))
    assert "**met**" in text and "+0.0 MB from t = 180.0 s" in text
    assert "| 3600 | 3600 | 0 | 0 | 3600 | 0 | 1 | 1 |" in text  # the resent 7: a duplicate, out of order
    assert "| 2 | 120.0 | 0.1 | 5.0 | never | never |" in text
    assert "1 never delivered a live result again" in text
    assert "ERROR lines in the agent's log: 2; 2 x `agent.mqtt.connection.paho: failed to receive" in text
    failed = soak_broker.report(args, _run(lost=[10, 11, 12, 40]))
    assert "**NOT met**" in failed and "4 lost" in failed and ": 10-12, 40." in failed
