"""The gate-run verdict (images/bin/image_gates_report.py) and the pair's metric parsing."""

from __future__ import annotations

import pytest

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="{n}">{cases}</testsuite></testsuites>
"""


def _xml(tmp_path, *cases: tuple[str, str]) -> str:
    body = []
    for name, outcome in cases:
        inner = {"passed": "", "failed": '<failure message="chi2 1523 &gt; 70">x</failure>',
                 "error": '<error message="boom">x</error>',
                 "skipped": '<skipped message="no GPU: NVML absent"/>'}[outcome]
        body.append(f'<testcase classname="tests.gates.mod" name="{name}" time="1.5">'
                    f"{inner}</testcase>")
    path = tmp_path / "gates.xml"
    path.write_text(JUNIT.format(n=len(cases), cases="".join(body)))
    return str(path)


def test_cases_are_read_with_outcome_and_message(gates_report, tmp_path):
    cases = gates_report.read_cases(_xml(tmp_path, ("a", "passed"), ("b", "failed"),
                                         ("c", "skipped")))
    assert [(c.id, c.outcome) for c in cases] == [
        ("tests.gates.mod::a", "passed"), ("tests.gates.mod::b", "failed"),
        ("tests.gates.mod::c", "skipped")]
    assert cases[1].message == "chi2 1523 > 70"
    assert cases[2].message == "no GPU: NVML absent"


@pytest.mark.parametrize(("cases", "rc", "ok"), [
    ([("a", "passed"), ("nvml", "skipped")], 0, True),
    ([("a", "passed"), ("b", "failed")], 1, False),
    ([("a", "passed"), ("b", "error")], 1, False),
    ([("a", "skipped")], 0, False),  # a suite that ran nothing proves nothing
    ([("a", "passed")], 2, False),  # pytest itself failed (e.g. collection error)
])
def test_normal_verdict(gates_report, tmp_path, cases, rc, ok):
    got, reason = gates_report.verdict(gates_report.read_cases(_xml(tmp_path, *cases)), rc, None)
    assert got is ok, reason


@pytest.mark.parametrize(("cases", "ok"), [
    ([("test_vllm_sampling_gate[t1]", "failed"), ("test_greedy", "passed")], True),
    ([("test_vllm_sampling_gate[t1]", "passed")], False),  # the gate missed the bug
    ([("test_vllm_sampling_gate[t1]", "failed"), ("test_wire", "failed")], False),  # stray
])
def test_expect_fail_verdict(gates_report, tmp_path, cases, ok):
    got, reason = gates_report.verdict(gates_report.read_cases(_xml(tmp_path, *cases)), 1,
                                       "vllm_sampling")
    assert got is ok, reason


def test_main_exit_code(gates_report, tmp_path, capsys):
    xml = _xml(tmp_path, ("a", "passed"), ("b", "failed"))
    assert gates_report.main([xml, "--exit-code", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert gates_report.main([xml, "--exit-code", "1", "--expect-fail", "::b$"]) == 0


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 60.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 31.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"} 10.0
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""


def test_spec_metrics_are_parsed_per_position(pair_report):
    m = pair_report.spec_metrics(METRICS)
    assert m["vllm:spec_decode_num_drafts_total"] == 20.0
    assert m["vllm:spec_decode_num_accepted_tokens_total"] == 31.0
    assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total[1]"] == 10.0
    assert not any("num_requests_running" in k for k in m)


def test_created_gauges_are_not_counted(pair_report):
    text = METRICS + (
        'vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",position="0"} 1.79e9\n')
    m = pair_report.spec_metrics(text)
    assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total[0]"] == 15.0
    assert not any("created" in k for k in m)


def test_specpairs_accepted_are_summed_over_modes_per_position(pair_report):
    text = METRICS + (
        'specpair_accepted_drafts_total{mode="sampled",position="1"} 12.0\n'
        'specpair_accepted_drafts_total{mode="greedy",position="1"} 3.0\n'
        'specpair_accepted_drafts_total{mode="sampled",position="2"} 10.0\n'
        'specpair_accepted_drafts_created{mode="sampled",position="2"} 1.79e9\n')
    assert pair_report.specpair_accepted(text) == {1: 15.0, 2: 10.0}


def test_late_items_are_read_from_the_targets_page(pair_report):
    page = ('specpair_items_total{outcome="ok",reason="none"} 390.0\n'
            'specpair_items_total{outcome="missing",reason="late"} 7.0\n'
            'specpair_items_total{outcome="missing",reason="disconnected"} 2.0\n')
    assert pair_report.late_items(page) == 7.0
    assert pair_report.late_items("vllm:num_requests_running 0.0\n") == 0.0


def test_must_fail_names_the_gate_that_has_to_catch_the_bug(gates_report, tmp_path):
    cases = gates_report.read_cases(_xml(tmp_path, ("test_attestation_gate", "failed"),
                                         ("test_vllm_sampling_gate", "passed")))
    ok, reason = gates_report.verdict(cases, 1, "attestation|vllm_sampling", ("vllm_sampling",))
    assert not ok and "missed the bug" in reason
    cases = gates_report.read_cases(_xml(tmp_path, ("test_attestation_gate", "failed"),
                                         ("test_vllm_sampling_gate", "failed")))
    assert gates_report.verdict(cases, 1, "attestation|vllm_sampling", ("vllm_sampling",))[0]


def test_the_health_wait_counts_from_the_start_of_the_whole_wait(pair_report, capsys):
    """scripts/local-pair.sh probes in many short calls: each reports the time since --since."""
    import http.server
    import threading
    import time

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert pair_report.wait(port, 5.0, since=time.time() - 42) == 0
        assert ">> target healthy after 42s" in capsys.readouterr().out
        assert pair_report.wait(port, 5.0) == 0
        assert ">> target healthy after 0s" in capsys.readouterr().out
    finally:
        server.shutdown()
        server.server_close()
