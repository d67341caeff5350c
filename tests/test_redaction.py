"""One redaction rule for config keys, environment variables and command-line options:
the names that hold secrets in real training setups are redacted, and the ordinary names
that merely look like them survive."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import tracklake
from tracklake._ops.pack.pack import pack
from tracklake._write.identity import (
    REDACTED,
    redact_argv,
    redact_config,
    redact_env,
    redact_value,
    secret_name,
)

#: Names that hold secrets, as they appear in configs, environments and command lines.
SECRET_NAMES = [
    # config keys (flattened with "/" or written with ".")
    "my_service_token", "wandb_key", "auth", "db.pass", "db/password", "wandb/api_key",
    "openai.api_key", "apiKey", "wandbKey", "hf_token", "huggingface/token",
    "s3/secret_access_key", "aws_secret_access_key", "aws_access_key_id",
    "client_secret", "secret", "secret_key_base", "credentials", "gcp/credentials",
    "private_key", "ssh/private-key", "session_token", "session_id", "cookie",
    "refresh_token", "access_token", "bearer", "authorization", "auth_header",
    "slack/webhook_url", "discord_webhook", "sentry/dsn", "db/passwd", "smtp/passphrase",
    "redis/pwd", "jwt", "mlflow/tracking_password", "comet_api_key", "key", "token",
    "use_auth_token",
    # environment variables
    "DB_PASS", "MY_SERVICE_PAT", "GITHUB_PAT", "WANDB_API_KEY", "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS", "MLFLOW_TRACKING_PASSWORD",
    "SLACK_WEBHOOK_URL", "SENTRY_DSN", "PGPASSWORD", "OPENAIAPIKEY", "DOCKER_AUTH_CONFIG",
    "NPM_TOKEN", "CI_JOB_TOKEN", "COOKIE_SECRET", "AZURE_STORAGE_SAS", "AWSSECRETKEY",
    "SSHKEY", "HFTOKEN",
    # command-line options
    "--db-pass", "--wandb-key", "--api-key", "--hf_token", "--password", "--secret",
    "--auth", "--private-key",
]

#: Names that look like secret words but hold ordinary settings; they must survive.
ORDINARY_NAMES = [
    "max_tokens", "max_new_tokens", "num_tokens", "tokenizer", "tokenizer_path",
    "tokenizer/name", "token_budget", "pad_token", "eos_token", "tokenizer/bos_token",
    "pad_token_id", "key_dim", "num_keys", "num_key_value_heads", "past_key_values",
    "data/prompt_key", "data/image_key", "reward_model/reward_fn_key", "sort_key",
    "passes", "num_passes", "bypass", "keyword", "monkey", "secretary_count",
    "passwords_seen", "api_keys_loaded_count", "password_min_length", "secret_name",
    "credentials_file", "session_name", "private_key_path", "token_type", "auth_type",
    "lr", "model/name", "PWD", "OLDPWD", "PATH", "HOME", "CUDA_VISIBLE_DEVICES",
    "SLURM_JOB_ID", "MASTER_ADDR", "--max-tokens", "--tokenizer", "--num-keys",
]


def test_the_tables_are_realistic_and_large() -> None:
    assert len(SECRET_NAMES) >= 40 and len(ORDINARY_NAMES) >= 40
    assert not set(SECRET_NAMES) & set(ORDINARY_NAMES)


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names_are_redacted_as_config_key_env_name_and_option(name: str) -> None:
    value = "s3cr3t-Value-q81z"
    assert secret_name(name)
    assert redact_config({name: value}) == {name: REDACTED}
    assert redact_env({name: value}) == {name: REDACTED}
    option = name if name.startswith("-") else f"--{name}"
    assert redact_argv([option, value]) == [option, REDACTED]
    assert redact_argv([f"{option}={value}"]) == [f"{option}={REDACTED}"]


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names_survive(name: str) -> None:
    value = "512"
    assert not secret_name(name)
    assert redact_config({name: value}) == {name: value}
    assert redact_env({name: value}) == {name: value}
    option = name if name.startswith("-") else f"--{name}"
    assert redact_argv([option, value]) == [option, value]
    assert redact_argv([f"{option}={value}"]) == [f"{option}={value}"]


@pytest.mark.parametrize("value", [
    "https://hooks.slack.com/services/T0001/B0002/XXXXXXXXXXXXXXXXXXXXXXXX",
    "https://discord.com/api/webhooks/123456789/abcdefghijklmnop",
    "https://acme.webhook.office.com/webhookb2/abc-def/IncomingWebhook/0123/xyz",
    "postgres://svc:hunter2x@db.internal:5432/runs",
    "https://api.example.com/v1?api_key=hunter2x&format=json",
    "host=db.internal user=svc password=hunter2x dbname=runs",
    "Server=tcp:db;Database=runs;User Id=svc;Password=hunter2x;",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
])
def test_credentials_inside_values_are_redacted(value: str) -> None:
    out = redact_value(value)
    assert REDACTED in out
    for secret in ("hunter2x", "XXXXXXXXXXXXXXXXXXXXXXXX", "abcdefghijklmnop", "IncomingWebhook",
                   "abcdefghijklmnopqrstuvwxyz"):
        assert secret not in out


def test_a_json_config_on_the_command_line_is_redacted_inside() -> None:
    cfg = {"lr": 0.1, "wandb_key": "k-0123456789", "db": {"pass": "p-0123456789"}}
    argv = ["train.py", "--config", json.dumps(cfg), f"--overrides={json.dumps(cfg)}"]
    out = redact_argv(argv)
    assert "k-0123456789" not in json.dumps(out) and "p-0123456789" not in json.dumps(out)
    redacted = {"lr": 0.1, "wandb_key": REDACTED, "db": {"pass": REDACTED}}
    assert json.loads(out[2]) == redacted
    assert json.loads(out[3].partition("=")[2]) == redacted
    assert redact_argv(["--config", '{"lr": 0.1}']) == ["--config", '{"lr": 0.1}']


def test_a_flag_before_another_option_does_not_hide_it() -> None:
    assert redact_argv(["--private", "--lr", "0.1"]) == ["--private", "--lr", "0.1"]


def test_booleans_and_empty_values_under_secret_names_are_kept() -> None:
    assert redact_config({"hub/private": True, "token": None, "password": ""}) == {
        "hub/private": True, "token": None, "password": ""}


def test_nothing_the_issue_listed_reaches_the_store_or_a_pack(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The names of a first week of real use, through init, log_config and pack."""
    secrets = [f"leak{i:02d}-Zq7x" for i in range(12)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DB_PASS", secrets[0])
    monkeypatch.setenv("MY_SERVICE_PAT", secrets[1])
    monkeypatch.setenv("NOTIFY", f"https://hooks.slack.com/services/T1/B2/{secrets[2]}")
    monkeypatch.setattr(sys, "argv", [
        "train.py", "--db-pass", secrets[3], "--wandb-key", secrets[4],
        f"--db-pass={secrets[5]}", "--config", json.dumps({"auth": secrets[6]})])
    run = tracklake.init(project="p", run_id="r", root=root, config={
        "my_service_token": secrets[7], "wandb_key": secrets[8], "auth": secrets[9],
        "db": {"pass": secrets[10]}, "max_tokens": 512, "tokenizer_path": "/models/tok",
        "key_dim": 64})
    run.log_config({"db.pass": secrets[11]})
    run.log({"loss": 1.0}, step=0)
    run.finish()
    out = tmp_path / "runs.pack"
    pack(root=root, all_runs=True, output=out)
    files = [p for p in root.rglob("*") if p.is_file()] + [out]
    for secret in secrets:
        assert [p for p in files if secret.encode() in p.read_bytes()] == [], secret
    attempt = json.loads(next(root.glob("runs/**/attempt=1.json")).read_bytes())
    assert attempt["config"]["max_tokens"] == 512
    assert attempt["config"]["tokenizer_path"] == "/models/tok"
    assert attempt["config"]["key_dim"] == 64


def test_values_of_a_million_characters_are_redacted_in_one_pass(tmp_path: Path) -> None:
    """A config string of a million letters (a prompt template, a serialized tokenizer),
    an environment variable and an argument of 100,000 (the most Linux passes is 128 KiB
    each), each with a secret pair at its end: the search for ``name=value`` pairs was
    retried from every letter of a run, 4.5 s at 20,000 letters and hours at a million,
    so `init` hung. The run is bounded at 120 s to catch such a hang (it takes about a
    second), not to time it."""
    import os
    import subprocess

    code = (
        "import sys, tracklake\n"
        "with tracklake.init(project='p', run_id='r', root=sys.argv[1], system_metrics=False,\n"
        "                    config={'prompt': 'x' * 1_000_000 + ' api_key=sk-0123456789ab'}):\n"
        "    pass\n")
    long = "y" * 100_000
    subprocess.run([sys.executable, "-c", code, str(tmp_path), long + ",token=abcdefgh12"],
                   env={**os.environ, "LONG_SETTING": long + " password=hunter2x"},
                   check=True, timeout=120)
    [config] = tracklake.query("SELECT value FROM configs WHERE key = 'prompt'",
                               root=tmp_path).column(0)
    assert json.loads(config.as_py()) == "x" * 1_000_000 + f" api_key={REDACTED}"
    [identity] = tracklake.query("SELECT identity FROM run_attempts", root=tmp_path).column(0)
    captured = json.loads(identity.as_py())
    assert captured["env"]["LONG_SETTING"] == f"{long} password={REDACTED}"
    assert captured["command"][-1] == f"{long},token={REDACTED}"
