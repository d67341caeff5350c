"""Secrets in the environment, the command line and the config never reach the disk."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import tracklake
from tracklake._write.identity import (
    REDACTED,
    capture,
    redact_argv,
    redact_config,
    redact_env,
    redact_value,
    secret_key,
    secret_name,
)

# Distinctive values, so that finding one in a file cannot be a coincidence.
SECRETS = {
    "MY_API_KEY": "sk-abcdefghijklmnop0123456789XYZ",
    "HF_TOKEN": "hf_ZYXWVUTSRQPONMLKJIHGFEDCBA012345",
    "DB_PASSWORD": "pa55w0rd-Qx7zK9-unique",
    "GITHUB_PAT": "ghp_0123456789abcdefghijABCDEFGHIJ",
}
URL_PASSWORD = "Urlp4ssw0rdQz81"
BEARER = "abc.def.ghijklmnopQRST"
ARGV_API_KEY = "argv-api-key-7f3a9c21e"
ARGV_TOKEN = "argv-token-c0ffee5512"
CONFIG_SECRET = "cfg-wandb-key-9d8e7f6a5b"
VISIBLE = "visible123"


def _all_bytes(directory: Path) -> list[tuple[Path, bytes]]:
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert files, f"nothing written under {directory}"
    return [(p, p.read_bytes()) for p in files]


def _occurrences(directory: Path, needle: str) -> list[Path]:
    raw = needle.encode()
    return [p for p, data in _all_bytes(directory) if raw in data]


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SOME_URL", f"https://user:{URL_PASSWORD}@host.example/x")
    monkeypatch.setenv("UPSTREAM_HEADER", f"Bearer {BEARER}")
    monkeypatch.setenv("MY_SETTING", VISIBLE)
    monkeypatch.setattr(sys, "argv", ["train.py", "--lr", "0.01", "--api-key", ARGV_API_KEY,
                                      f"--token={ARGV_TOKEN}", "--epochs", "3"])
    monkeypatch.chdir(tmp_path)  # no git work tree: git state stays out of the picture


def test_no_secret_reaches_any_file_of_the_store(root: Path, secret_env: None) -> None:
    """Env vars with secret names or credential-looking values, secret command-line options
    and secret config keys are redacted everywhere on disk (attempt records, configs,
    every segment and part), while ordinary values are kept."""
    config = {"lr": 0.000123, "wandb": {"api_key": CONFIG_SECRET, "project": "visible-proj"},
              "db_url": f"postgres://svc:{URL_PASSWORD}@db/x"}
    run = tracklake.init(project="p", run_id="secret-run", config=config, root=root,
                         capture_identity=True)
    run.log({"loss": 0.5}, step=0)
    run.log_config({"extra": {"token": SECRETS["HF_TOKEN"]}})
    run.finish()
    tracklake.compact(root=root)  # secrets must not come back in Parquet either

    for secret in [*SECRETS.values(), URL_PASSWORD, BEARER, ARGV_API_KEY, ARGV_TOKEN,
                   CONFIG_SECRET]:
        assert _occurrences(root, secret) == [], f"secret {secret!r} written to disk"
    for visible in [VISIBLE, "0.000123", "visible-proj", "MY_SETTING", "--epochs", "train.py",
                    "https://user:", REDACTED]:
        assert _occurrences(root, visible), f"{visible!r} should have been recorded"

    attempt = json.loads(next(root.glob("runs/**/attempt=1.json")).read_bytes())
    env = attempt["identity"]["env"]
    assert env["MY_SETTING"] == VISIBLE
    assert env["MY_API_KEY"] == env["HF_TOKEN"] == env["DB_PASSWORD"] == REDACTED
    assert env["SOME_URL"] == f"https://user:{REDACTED}@host.example/x"
    assert attempt["identity"]["command"][1:] == [
        "train.py", "--lr", "0.01", "--api-key", REDACTED, f"--token={REDACTED}", "--epochs",
        "3"]
    assert attempt["config"]["wandb/api_key"] == REDACTED
    assert attempt["config"]["lr"] == 0.000123


def test_secrets_nested_in_config_lists_do_not_reach_disk(root: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.chdir(tmp_path)
    run = tracklake.init(project="p", root=root, capture_identity=False, config={
        "services": [{"name": "a", "api_key": CONFIG_SECRET}],
        "fallback_keys": [SECRETS["MY_API_KEY"]],
    })
    run.finish()
    assert _occurrences(root, CONFIG_SECRET) == []
    assert _occurrences(root, SECRETS["MY_API_KEY"]) == []


def test_aws_secret_access_key_is_redacted_in_config_and_argv() -> None:
    assert secret_key("aws_secret_access_key")
    assert redact_config({"aws/secret_access_key": "x" * 40}) == {
        "aws/secret_access_key": REDACTED}
    assert redact_argv(["--aws-secret-access-key", "v"]) == ["--aws-secret-access-key", REDACTED]


# -- unit tests --------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["api_key", "API_KEY", "apikey", "api-key", "--api-key",
                                 "wandb/api_key", "openai.api_key", "token", "--token",
                                 "hf_token", "access_token", "auth_token", "secret",
                                 "client_secret", "secret_key", "password", "db.passwd",
                                 "credentials", "credential", "private_key", "ssh/private-key"])
def test_secret_keys(key: str) -> None:
    assert secret_key(key)


@pytest.mark.parametrize("key", ["max_tokens", "num_tokens", "tokenizer", "token_budget",
                                 "lr", "keyword", "monkey", "secretary_count", "passwords_seen",
                                 "max_new_tokens", "api_keys_loaded_count", "model/name"])
def test_non_secret_keys(key: str) -> None:
    assert not secret_key(key)


@pytest.mark.parametrize(("name", "secret"), [
    ("MY_API_KEY", True), ("HF_TOKEN", True), ("DB_PASSWORD", True), ("AWS_SECRET", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True), ("session_id", True), ("my_auth", True),
    ("MY_SETTING", False), ("PATH", False), ("HOME", False), ("CUDA_VISIBLE_DEVICES", False),
])
def test_secret_env_names(name: str, secret: bool) -> None:
    assert secret_name(name) is secret


def test_redact_env_hides_secret_names_and_credential_values() -> None:
    env = {"HF_TOKEN": "anything", "MY_SETTING": VISIBLE, "PATH": "/usr/bin",
           "SOME_URL": f"https://user:{URL_PASSWORD}@host/x",
           "HEADER": f"Bearer {BEARER}", "PLAIN_SK": SECRETS["MY_API_KEY"],
           "GH": SECRETS["GITHUB_PAT"], "AWS_ID": "AKIAABCDEFGHIJKLMNOP"}
    out = redact_env(env)
    assert out["HF_TOKEN"] == REDACTED
    assert out["MY_SETTING"] == VISIBLE and out["PATH"] == "/usr/bin"
    assert out["SOME_URL"] == f"https://user:{REDACTED}@host/x"
    assert out["HEADER"] == REDACTED and out["PLAIN_SK"] == REDACTED
    assert out["GH"] == REDACTED and out["AWS_ID"] == REDACTED
    assert list(out) == sorted(env)
    flat = json.dumps(out)
    for secret in (URL_PASSWORD, BEARER, SECRETS["MY_API_KEY"], SECRETS["GITHUB_PAT"]):
        assert secret not in flat


def test_redact_argv_hides_values_of_secret_options() -> None:
    argv = ["python", "train.py", "--api-key", "V1", "--token=V2", "--lr", "0.1",
            "--hf_token", "V3", "wandb.api_key=V4", "--password=", "--max-tokens", "512",
            f"--url=https://u:{URL_PASSWORD}@h/x"]
    assert redact_argv(argv) == [
        "python", "train.py", "--api-key", REDACTED, f"--token={REDACTED}", "--lr", "0.1",
        "--hf_token", REDACTED, f"wandb.api_key={REDACTED}", "--password=",
        "--max-tokens", "512", f"--url=https://u:{REDACTED}@h/x"]


def test_redact_argv_with_secret_option_last_does_not_fail() -> None:
    assert redact_argv(["run", "--token"]) == ["run", "--token"]


def test_redact_config_hides_secret_keys_and_credential_strings_only() -> None:
    flat = {"wandb/api_key": "k", "lr": 0.1, "max_tokens": 512, "token": None, "password": "",
            "endpoint": f"https://u:{URL_PASSWORD}@h/x", "note": f"Bearer {BEARER}",
            "layers": [1, 2]}
    assert redact_config(flat) == {
        "wandb/api_key": REDACTED, "lr": 0.1, "max_tokens": 512, "token": None, "password": "",
        "endpoint": f"https://u:{REDACTED}@h/x", "note": REDACTED, "layers": [1, 2]}


@pytest.mark.parametrize("value", ["eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4",
                                   "xoxb-1234567890-abcdef", "token abcdefgh12345678",
                                   "Basic dXNlcjpwYXNzd29yZA=="])
def test_redact_value_recognises_common_credential_shapes(value: str) -> None:
    assert redact_value(f"prefix {value} suffix") == f"prefix {REDACTED} suffix"


def test_redact_value_leaves_ordinary_text_alone() -> None:
    text = "https://example.com/path?q=1 lr=0.1 sk-short tokenizer"
    assert redact_value(text) == text


def test_capture_redacts_env_and_command(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["x.py", "--api-key", ARGV_API_KEY])
    ident = capture(env={"DB_PASSWORD": "p", "MY_SETTING": VISIBLE})
    assert ident["env"] == {"DB_PASSWORD": REDACTED, "MY_SETTING": VISIBLE}
    assert ident["command"][1:] == ["x.py", "--api-key", REDACTED]
    assert ident["git"] is None
    assert ARGV_API_KEY not in json.dumps(ident)


def test_packages_are_what_importlib_metadata_says() -> None:
    """Read from METADATA's header lines, the same names and versions as a full parse."""
    import importlib.metadata

    from tracklake._write.identity import packages

    expected = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()
                if d.metadata["Name"]}
    found = packages()
    assert found == dict(sorted(expected.items(), key=lambda kv: kv[0].lower()))
    assert found["pyarrow"] == importlib.metadata.version("pyarrow")
