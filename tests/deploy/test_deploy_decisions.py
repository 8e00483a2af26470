"""The decisions of a move as pure Python, in milliseconds: the recovery decision
(specpair.deploy.recovery: finish an interrupted move forward or back, or refuse) over every
case the kill sweep (test_deploy_recovery.py, `make deploy-sweep`) can leave, and the
pair-whole verdict (specpair.deploy.verdict). Each expected decision is the one the playbooks'
Jinja took before the decisions moved to Python (checked then by evaluating the old
expressions with Ansible's templar over these very inputs). Last, the filter plugin the
playbooks call them through (playbooks/filter_plugins/specpair_decisions.py).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from specpair.deploy.errors import RecordsDisagree
from specpair.deploy.recovery import finish, interrupted_move, runs_healthy
from specpair.deploy.verdict import pair_verdict, runs_record

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("sparkhead", "sparkworker", "x86host")  # play order, as in inventories/local
ID = "sha256:" + "a" * 64


def release(name: str) -> dict:
    return {"name": name, "profiles": {"target": "cpu", "drafter": "cpu"},
            "images": {"target": ID, "drafter": ID}, "config": {"depth": 2},
            "config_hash": name * 8}


S0, SA, SB, SC = (release(n) for n in ("s0", "sa", "sb", "sc"))
# Release records (roles/specpair_release); ABSENT is how the play reads a missing file.
OLD = {"schema": 1, "current": SA, "previous": S0}  # before the move: sa
NEW = {"schema": 1, "current": SB, "previous": SA}  # what the move commits: sb
OTHER = {"schema": 1, "current": SC, "previous": S0}  # no move's before or after: a hand edit
ABSENT = {"current": None, "previous": None}


def intent(phase: str, action: str = "deploy", before: dict = OLD, to: dict = SB) -> dict:
    """An intent file as playbooks/tasks/intent.yml writes it."""
    return {"schema": 1, "run": f"20261201T134501Z-{action}-4242", "action": action,
            "phase": phase, "since": "2026-12-01T13:45:01Z", "before": before, "to": to}


# The intent's phase: no intent file, done (the last move finished), moving (killed before
# every host passed), commit (killed while the records were being written).
INTENTS = {"no intent": None, "done": intent("done"), "moving": intent("moving"),
           "commit": intent("commit")}

# How the hosts' records agree. A record is written only in the commit phase, one atomic
# rename per host and the hosts in parallel: a kill leaves each host's record old or new, so
# any set of hosts may record sb (named by role: head, worker, drafter). "head sc": a record
# no move wrote (a hand edit).
ROLES = dict(zip(("head", "worker", "drafter"), HOSTS, strict=True))


def recording_sb(*roles: str) -> dict:
    """Each host's record: sb on the hosts of these roles, sa on the others."""
    return {host: NEW if role in roles else OLD for role, host in ROLES.items()}


RECORDS = {
    "all sa": recording_sb(),
    "head sb": recording_sb("head"),  # the head's write first, as in the default run's kill
    "worker sb": recording_sb("worker"),
    "drafter sb": recording_sb("drafter"),
    "head+worker sb": recording_sb("head", "worker"),
    "head+drafter sb": recording_sb("head", "drafter"),
    "worker+drafter sb": recording_sb("worker", "drafter"),  # as in the sweep's last row
    "all sb": recording_sb("head", "worker", "drafter"),
    "head sc": {**recording_sb(), "sparkhead": OTHER},
}


def container(running: str, health: str | None = "healthy", restarting: bool = False) -> dict:
    """A service as the play sees it: the service role's inspect (``matches``: it runs sb)
    and docker_container_info's answer (``info``)."""
    if running == "gone":
        return {"matches": False, "info": {"exists": False}}
    state = {"Running": True, "Restarting": restarting,
             **({"Health": {"Status": health}} if health else {})}
    return {"matches": running == "sb", "info": {"exists": True, "container": {"State": state}}}


# What each service runs at the kill (head, drafter), the table's columns 1-8; the worker has
# no service, as in inventories/local, so it always counts as running the release.
SERVICES = {
    "both sb": (container("sb"), container("sb")),  # 1: committing, every host passed
    "both sa": (container("sa"), container("sa")),  # 2: intent written, nothing moved yet
    "none": (container("gone"), container("gone")),  # 3: the old pair removed
    "drafter sb": (container("gone"), container("sb")),  # 4: new drafter started, no target
    "head starting": (container("sb", "starting"), container("sb")),  # 5: new target started
    "drafter restarting": (container("sb"), container("sb", "starting", restarting=True)),  # 6
    "drafter unhealthy": (container("sb"), container("sb", "unhealthy")),  # 7
    "no healthchecks": (container("sb", None), container("sb", None)),  # 8: none to wait for
}
# The hosts that do not run sb healthy, per column (named when a committing move goes back).
BEHIND = {"both sb": "", "both sa": "sparkhead, x86host", "none": "sparkhead, x86host",
          "drafter sb": "sparkhead", "head starting": "sparkhead",
          "drafter restarting": "x86host", "drafter unhealthy": "x86host",
          "no healthchecks": ""}

# The decision per (intent, records) row and SERVICES column: "-" nothing to finish, "R"
# refused (records nobody can explain), "F" rolled forward to sb, "B" rolled back to sa.
COLUMNS = list(SERVICES)
TABLE = {
    # SERVICES:                          1   2   3   4   5   6   7   8
    ("no intent", "all sa"):            "-   -   -   -   -   -   -   -",
    ("no intent", "head sb"):           "F   B   B   B   B   B   B   F",
    ("no intent", "worker sb"):         "F   B   B   B   B   B   B   F",
    ("no intent", "drafter sb"):        "F   B   B   B   B   B   B   F",
    ("no intent", "head+worker sb"):    "F   B   B   B   B   B   B   F",
    ("no intent", "head+drafter sb"):   "F   B   B   B   B   B   B   F",
    ("no intent", "worker+drafter sb"): "F   B   B   B   B   B   B   F",
    ("no intent", "all sb"):            "-   -   -   -   -   -   -   -",
    ("no intent", "head sc"):           "R   R   R   R   R   R   R   R",
    ("done", "all sa"):                 "-   -   -   -   -   -   -   -",
    ("done", "head sb"):                "F   B   B   B   B   B   B   F",
    ("done", "worker sb"):              "F   B   B   B   B   B   B   F",
    ("done", "drafter sb"):             "F   B   B   B   B   B   B   F",
    ("done", "head+worker sb"):         "F   B   B   B   B   B   B   F",
    ("done", "head+drafter sb"):        "F   B   B   B   B   B   B   F",
    ("done", "worker+drafter sb"):      "F   B   B   B   B   B   B   F",
    ("done", "all sb"):                 "-   -   -   -   -   -   -   -",
    ("done", "head sc"):                "R   R   R   R   R   R   R   R",
    ("moving", "all sa"):               "B   B   B   B   B   B   B   B",
    ("moving", "head sb"):              "B   B   B   B   B   B   B   B",
    ("moving", "worker sb"):            "B   B   B   B   B   B   B   B",
    ("moving", "drafter sb"):           "B   B   B   B   B   B   B   B",
    ("moving", "head+worker sb"):       "B   B   B   B   B   B   B   B",
    ("moving", "head+drafter sb"):      "B   B   B   B   B   B   B   B",
    ("moving", "worker+drafter sb"):    "B   B   B   B   B   B   B   B",
    ("moving", "all sb"):               "B   B   B   B   B   B   B   B",
    ("moving", "head sc"):              "B   B   B   B   B   B   B   B",
    ("commit", "all sa"):               "F   B   B   B   B   B   B   F",
    ("commit", "head sb"):              "F   B   B   B   B   B   B   F",
    ("commit", "worker sb"):            "F   B   B   B   B   B   B   F",
    ("commit", "drafter sb"):           "F   B   B   B   B   B   B   F",
    ("commit", "head+worker sb"):       "F   B   B   B   B   B   B   F",
    ("commit", "head+drafter sb"):      "F   B   B   B   B   B   B   F",
    ("commit", "worker+drafter sb"):    "F   B   B   B   B   B   B   F",
    ("commit", "all sb"):               "F   B   B   B   B   B   B   F",
    ("commit", "head sc"):              "F   B   B   B   B   B   B   F",
}
CASES = [(i, r, s, cell) for (i, r), row in TABLE.items()
         for s, cell in zip(COLUMNS, row.split(), strict=True)]


def decide(intent_: dict | None, records: dict, services: dict[str, tuple[dict, dict]]
           ) -> tuple[str, dict | None, str]:
    """The playbook's path through the decisions: find the move; inspect the services (here:
    given); finish it. -> (decision, record written, why)."""
    try:
        move = interrupted_move(intent_, records)
    except RecordsDisagree as e:
        return "R", None, str(e)
    if move is None:
        return "-", None, ""
    head, drafter = services
    runs_new = {"sparkhead": runs_healthy(head["info"], head["matches"], True),
                "sparkworker": runs_healthy({}, True, False),  # no service here
                "x86host": runs_healthy(drafter["info"], drafter["matches"], True)}
    done = finish(move, runs_new)
    return "F" if done.forward else "B", done.record, done.why


def test_the_table_covers_every_combination():
    assert set(TABLE) == {(i, r) for i in INTENTS for r in RECORDS}
    assert len(CASES) == len(INTENTS) * len(RECORDS) * len(SERVICES) == 288


@pytest.mark.parametrize(("intent_name", "records", "services", "want"), CASES,
                         ids=[f"{i}, {r}, {s}" for i, r, s, _ in CASES])
def test_the_recovery_decision(intent_name, records, services, want):
    got, record, why = decide(INTENTS[intent_name], RECORDS[records], SERVICES[services])
    assert got == want, why
    found = ("an unfinished deploy (run 20261201T134501Z-deploy-4242, phase "
             f"{intent_name})" if intent_name in ("moving", "commit")
             else "release records that disagree "
                  + str({h: r["current"]["name"] for h, r in RECORDS[records].items()}))
    if want == "F":  # every host records sb, with the release it replaced as previous
        assert record == {"schema": 1, "current": SB, "previous": SA}
        assert why == (f"found {found} of release sb from sa: rolled FORWARD to sb on every "
                       "host: its records were being committed and every host runs it healthy")
    elif want == "B":  # every host records what they all agreed on before the move
        assert record == OLD
        reason = (f"not every host runs it healthy ({BEHIND[services]})"
                  if intent_name != "moving" else "its records were not being committed yet")
        assert why == (f"found {found} of release sb from sa: rolled BACK to sa on every host: "
                       f"{reason}")
    elif want == "R":
        assert why == ("the hosts' release records disagree and no unfinished move explains "
                       "it: {'sparkhead': 'sc', 'sparkworker': 'sa', 'x86host': 'sa'}; copy the "
                       "release.json of the host that records the release you want onto the "
                       "others, then run restore")


def test_a_first_deploy_is_finished_forward_or_back_to_no_release():
    """Nothing recorded before: back means no release on any host (the record file removed);
    records that disagree with nothing recorded are the first deploy's commit."""
    first = intent("commit", before=ABSENT)
    _, record, why = decide(first, dict.fromkeys(HOSTS, ABSENT), SERVICES["both sb"])
    assert record == {"schema": 1, "current": SB, "previous": None}
    assert "of release sb from none: rolled FORWARD to sb" in why
    _, record, why = decide({**first, "phase": "moving"}, dict.fromkeys(HOSTS, ABSENT),
                            SERVICES["both sb"])
    assert record == ABSENT and "rolled BACK to no release on every host" in why
    head_first = {**dict.fromkeys(HOSTS, ABSENT), "sparkhead": {**NEW, "previous": None}}
    got, record, why = decide(None, head_first, SERVICES["both sb"])
    assert got == "F" and record == {"schema": 1, "current": SB, "previous": None}
    assert why.startswith("found release records that disagree {'sparkhead': 'sb', "
                          "'sparkworker': 'none', 'x86host': 'none'} of release sb from none")


@pytest.mark.parametrize(("action", "before", "to", "previous"), [
    ("restore", OLD, SA, S0),  # restore moves to the release already current: keep previous
    ("rollback", NEW, SA, SB),
])
def test_rollback_and_restore_intents_keep_a_previous_release(action, before, to, previous):
    got, record, why = decide(intent("commit", action, before, to), dict.fromkeys(HOSTS, before),
                              (container("sb"), container("sb")))  # matches: runs `to`
    assert got == "F" and record == {"schema": 1, "current": to, "previous": previous}
    assert why.startswith(f"found an unfinished {action} (run 20261201T134501Z-{action}-4242, "
                          f"phase commit) of release {to['name']} from {before['current']['name']}")


@pytest.mark.parametrize("text", [[1, 2], "moving", {"run": "x"}, {}])
def test_an_intent_without_a_phase_counts_as_done(text):
    assert interrupted_move(text, dict.fromkeys(HOSTS, OLD)) is None


def test_three_distinct_records_are_refused_even_with_a_successor_among_them():
    records = {"sparkhead": NEW, "sparkworker": OTHER, "x86host": OLD}
    with pytest.raises(RecordsDisagree, match="{'sparkhead': 'sb', 'sparkworker': 'sc', "):
        interrupted_move(None, records)
    assert interrupted_move(intent("moving"), records).before == OLD  # an intent explains them


def test_a_worker_with_a_service_counts_like_any_host():
    """inventories/prod: the Spark worker runs a service; restarting, it sends the move back."""
    move = interrupted_move(intent("commit"), dict.fromkeys(HOSTS, OLD))
    bad = container("sb", "starting", restarting=True)
    runs_new = {"sparkhead": True, "sparkworker": runs_healthy(bad["info"], True, True),
                "x86host": True}
    done = finish(move, runs_new)
    assert not done.forward and done.why.endswith("not every host runs it healthy (sparkworker)")


# runs_record: one host after a move (summary.yml's matches_record). The recorded release is
# sa with image ID; the container fields differ from a matching one only where named.
GOOD = {"exists": True, "container": {
    "State": {"Running": True, "Restarting": False, "Health": {"Status": "healthy"}},
    "Image": ID, "Config": {"Labels": {"specpair.config_hash": SA["config_hash"]}}}}


def _with(**state) -> dict:
    c = GOOD["container"]
    return {"exists": True, "container": {**c, "State": {**c["State"], **state}}}


HOST_CASES = {
    # name: (container, current, image_id, enabled, runs its record)
    "runs it": (GOOD, SA, ID, True, True),
    "no healthcheck": (_with(Health=None), SA, ID, True, True),
    "nothing recorded": (GOOD, None, ID, True, False),
    "image not staged": (GOOD, SA, "", True, False),
    "no service, image staged": ({"skipped": True}, SA, ID, False, True),
    "no service, image missing": ({"skipped": True}, SA, "", False, False),
    "container gone": ({"exists": False}, SA, ID, True, False),
    "stopped": (_with(Running=False), SA, ID, True, False),
    "restarting": (_with(Restarting=True), SA, ID, True, False),
    "starting": (_with(Health={"Status": "starting"}), SA, ID, True, False),
    "unhealthy": (_with(Health={"Status": "unhealthy"}), SA, ID, True, False),
    "another image": (GOOD, SA, "sha256:" + "b" * 64, True, False),
    "another config": (GOOD, SB, ID, True, False),
    "no labels": ({"exists": True, "container": {**GOOD["container"], "Config": {"Labels": None}}},
                  SA, ID, True, False),
}


@pytest.mark.parametrize("name", HOST_CASES)
def test_a_host_runs_its_record(name):
    container_, current, image_id, enabled, want = HOST_CASES[name]
    assert runs_record(container_, current, image_id, enabled) is want


@pytest.mark.parametrize(("hosts", "one", "every"), [
    ({"a": ("sa", True), "b": ("sa", True), "c": ("sa", True)}, True, True),
    ({"a": ("sa", True), "b": ("sb", True), "c": ("sa", True)}, False, True),
    ({"a": ("sa", True), "b": ("sa", False), "c": ("sa", True)}, True, False),
    ({"a": (None, False), "b": (None, False), "c": (None, False)}, True, False),
    ({"a": ("sb", False), "b": ("sa", True), "c": ("sa", True)}, False, False),
])
def test_the_pair_is_whole_when_one_release_is_recorded_and_every_host_runs_it(hosts, one,
                                                                                every):
    verdict = pair_verdict({h: {"record_current": c, "matches_record": m}
                            for h, (c, m) in hosts.items()})
    assert (verdict.one_release_recorded, verdict.every_host_runs_its_record) == (one, every)
    assert verdict.whole is (one and every)


def _plugin():
    path = ROOT / "playbooks" / "filter_plugins" / "specpair_decisions.py"
    spec = importlib.util.spec_from_file_location("specpair_decisions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def test_the_playbooks_call_only_the_plugins_filters_and_get_plain_data():
    filters = _plugin()
    used = {m.group(1) for p in (ROOT / "playbooks").rglob("*.yml")
            for m in re.finditer(r"\|\s*(specpair_\w+)", p.read_text())}
    assert used == set(filters), used
    found = filters["specpair_interrupted_move"](None, RECORDS["head sb"])
    assert found["refused"] == "" and found["move"]["to"] == SB
    done = filters["specpair_recovery"](found["move"], dict.fromkeys(HOSTS, True))
    assert done["forward"] and done["record"]["current"] == SB and "FORWARD" in done["why"]
    refused = filters["specpair_interrupted_move"](None, RECORDS["head sc"])
    assert refused["move"] is None and refused["refused"].startswith("the hosts' release records")
    assert filters["specpair_pair_verdict"]({"a": {"record_current": "sa",
                                                   "matches_record": True}}) == {
        "one_release_recorded": True, "every_host_runs_its_record": True, "whole": True}
