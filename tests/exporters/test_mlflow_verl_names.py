"""MLflow names as verl's own MLflow logger gives them (``@`` as ``_at_``), checked against
verl's sanitiser itself on the keys of verl's tests/utils/test_mlflow_key_sanitization.py,
and still never shared by two keys."""

from __future__ import annotations

import logging
import re

import pytest
from _optional import optional

optional("mlflow")  # the mlflow destination package needs it

from tracklake.exporters._shared.keys import DIGITS
from tracklake.exporters.mlflow.names import mlflow_key

verl_tracking = optional("verl.utils.tracking")

#: The keys of verl's test, and pass@k names as verl's metric_utils makes them.
VERL_TEST_KEYS = ["valid_key", "invalid@key!", "another/valid-key", "bad key#",
                  "val-aux//reward/mean_at_1", "val-core///acc/best_at_5",
                  "metric////with/many////slashes"]
PASS_AT_K = ["val-core/openai/gsm8k/acc/best@4/mean", "val-aux/openai/gsm8k/reward/maj@8/std",
             "val-core/x/acc/worst@16/mean", "a@b@c", "@", "@@"]


def _verl_name(key: str) -> str:
    adapter = verl_tracking._MlflowLoggingAdapter()
    logging.getLogger(verl_tracking.__name__).disabled = True  # its warning per renamed key
    try:
        return str(adapter._sanitize_key(key))
    finally:
        logging.getLogger(verl_tracking.__name__).disabled = False


@pytest.mark.parametrize("key", VERL_TEST_KEYS + PASS_AT_K)
def test_names_are_verls_or_verls_with_a_hash_where_verls_would_merge_keys(key: str) -> None:
    verl, ours = _verl_name(key), mlflow_key(key)
    if "_at_" in key or verl.replace("_at_", "@") != key:
        # verl's rule maps several keys to this name (`a//b` and `a/b`, `x#` and `x_`,
        # `a@b` and `a_at_b`): ours adds a hash of the key
        assert re.fullmatch(re.escape(verl) + f"-[0-9a-f]{{{DIGITS}}}", ours), (verl, ours)
    else:
        assert ours == verl


def test_pass_at_k_metrics_have_verls_names_exactly() -> None:
    for key in PASS_AT_K[:3]:
        assert mlflow_key(key) == _verl_name(key) == key.replace("@", "_at_")


def test_keys_verl_would_merge_stay_apart() -> None:
    groups = [["a@b", "a_at_b"], ["@at_", "_at@", "_at_at_"], ["x#", "x_", "x!"],
              ["a//b", "a/b", "a///b"], ["time@peak", "time_at_peak"]]
    for keys in groups:
        assert len({_verl_name(k) for k in keys}) == 1, keys  # verl merges them ...
        assert len({mlflow_key(k) for k in keys}) == len(keys), keys  # ... we do not


def test_names_are_stable_and_legal_for_mlflow() -> None:
    from mlflow.utils.validation import _validate_metric_name

    for key in VERL_TEST_KEYS + PASS_AT_K + ["time_at_peak", "@" * 100]:
        assert mlflow_key(key) == mlflow_key(key)
        _validate_metric_name(mlflow_key(key))
    assert len(mlflow_key("@" * 100)) <= 250
