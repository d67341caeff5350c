"""Retention: policies, the dry-run plan, applying it atomically, pins and the audit log
(docs/lifecycle.md)."""

from tracklake._ops.retention.apply import ApplyReport, RetainBusyError, apply_plan
from tracklake._ops.retention.audit import AUDIT_STREAM, audit_records
from tracklake._ops.retention.inventory import pin, unpin
from tracklake._ops.retention.plan import Action, Plan, Skip, make_plan
from tracklake._ops.retention.policy import (
    POLICY_FILE,
    BestRule,
    Policy,
    PolicyError,
    best_rule,
    check_fields,
    load_policy,
    parse_duration,
    parse_size,
)

__all__ = [
    "AUDIT_STREAM",
    "POLICY_FILE",
    "Action",
    "ApplyReport",
    "BestRule",
    "Plan",
    "Policy",
    "PolicyError",
    "RetainBusyError",
    "Skip",
    "apply_plan",
    "audit_records",
    "best_rule",
    "check_fields",
    "load_policy",
    "make_plan",
    "parse_duration",
    "parse_size",
    "pin",
    "unpin",
]
