"""Whatever a decision's evidence holds, the table keeps its audit record and its incident within DynamoDB's item
size (`Store.commit`, `core.record_budget`): a decision too big to write would never be decided."""

from __future__ import annotations

from stallwatch.aws.audit_trail import AUDIT_BYTES
from stallwatch.aws.job_states import StoredState
from stallwatch.aws.store import job_key
from stallwatch.core import record_budget
from stallwatch.core.decision import JobState
from stallwatch.core.signals import Platform
from tests.fixtures.request_limits import recording

KEY = job_key(Platform.EC2, "big-cluster")


def test_an_audit_far_over_the_item_size_is_committed_cut_to_fit(rt) -> None:
    # Given a decision whose evidence and reasons hold 2 MB (5,000 hosts' evidence, a 500 KB log line)
    now = rt.clock()
    hosts = {f"i-{n:017x}": {"gpu_util_now": 0.0, "last_words": "x" * 300} for n in range(5_000)}
    audit = {"at": now, "diagnosis": "hang", "action": "warn", "reasons": ["y" * 500_000], "evidence": {"hosts": hosts}}
    assert record_budget.size(audit) > 1_000_000
    written = StoredState(JobState(warned_at=now), 0, f"incident#{now:017.3f}")

    # When it is committed (its state, audit record and opened incident in one transaction)
    with recording() as requests:
        rt.states.commit(KEY, StoredState(), written, audit, now, acting=True)

    # Then every item is within DynamoDB's limits, and the audit record says it was cut, keeping what was decided
    assert [v for r in requests for v in r.violations()] == []
    (record,) = [r["record"] for r in rt.audit.records(KEY, "audit")]
    assert record_budget.size(record) <= AUDIT_BYTES
    assert (record["diagnosis"], record["action"], record[record_budget.CUT_KEY]) == ("hang", "warn", True)
    (incident,) = rt.audit.records(KEY, "incident")
    assert record_budget.size(incident["reasons"]) <= AUDIT_BYTES
