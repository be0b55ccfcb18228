"""The scrubber and the secrets it knows: a value is cut wherever it appears, credentials in
their usual shapes are cut even when nobody registered them, a value found in such a shape is
cut where it repeats, and a config field that wants a variable's NAME refuses a secret pasted
there without echoing it. The work is linear in the text (bench/bench_scrub.py prints the
figures; tests/fuzz/test_fuzz_scrub.py feeds it million-character inputs under the hang
limit)."""

from __future__ import annotations

import pytest

from autoscaler.model.errors import InputError
from autoscaler.model.secrets import (
    MAX_LEARNED,
    SECRETS,
    Secrets,
    looks_like_variable_name,
    read_secret_env,
    register_config_secrets,
    scrub_strings,
)

TOKEN = "tok-5b1f0e2a9c7d4e3f"


def test_a_token_echoed_after_its_bearer_header_is_cut_there_too() -> None:
    """Issue 15: the Bearer shape was cut and the same value a few words later was not."""
    body = (
        f'HTTP 401: Prometheus says unauthorized: header "Bearer {TOKEN}" rejected; '
        f"token {TOKEN} is not known"
    )
    scrubbed = Secrets().scrub(body)
    assert TOKEN not in scrubbed
    assert scrubbed.count("***") == 2 and "rejected; token *** is not known" in scrubbed


def test_a_registered_value_is_cut_wherever_it_appears() -> None:
    secrets = Secrets()
    secrets.add(TOKEN, "  padded-secret-value  ")
    text = f"x{TOKEN}y {{'t': '{TOKEN}'}} padded-secret-value"
    assert secrets.scrub(text) == "x***y {'t': '***'} ***"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://ctl:hunter2pass@db:5432/j", "postgresql://ctl:***@db:5432/j"),
        ("see https://u:p@ss@host/x now", "see https://u:***@host/x now"),
        ("redis://:pw0rdx@127.0.0.1:6379/0", "redis://:pw0rdx@127.0.0.1:6379/0"),
        ("http://host/a:b@c stays", "http://host/a:b@c stays"),
        ("Authorization: bearer abc.def-ghi", "Authorization: bearer ***"),
        ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG", "aws_secret_access_key=***"),
        ('{"password": "hunter22"}', '{"password": "***"}'),
        ("no secrets in here at all", "no secrets in here at all"),
    ],
)
def test_credentials_in_their_shapes_are_cut_unregistered(text: str, expected: str) -> None:
    assert Secrets().scrub(text) == expected


def test_the_issues_long_inputs_come_out_whole_with_their_secrets_cut() -> None:
    """The inputs that took 1.9 s (16,000 characters) and ~30 s (64,000) before: the same
    shapes, 16 times longer, with a credential at the far end."""
    tail = " postgresql://u:far-end-password@h/db"
    for body in ("a" * 1_000_000, "a://b:c" * 150_000, "a." * 500_000):
        scrubbed = Secrets().scrub(body + tail)
        assert scrubbed == body + " postgresql://u:***@h/db"


def test_repeats_of_many_shaped_values_are_bounded_but_every_shape_is_cut() -> None:
    pairs = [f"token=value-{i:04d}" for i in range(MAX_LEARNED + 8)]
    scrubbed = Secrets().scrub(" ".join(pairs))
    assert "value-" not in scrubbed and scrubbed.count("token=***") == len(pairs)


def test_scrub_strings_cuts_inside_json_like_data_before_escaping() -> None:
    quoted = 'tok"with\\quote-0042'
    SECRETS.add(quoted)
    data = {"problems": [f"source said {quoted}"], "n": 3, "nested": ({"k": quoted},)}
    expected = {"problems": ["source said ***"], "n": 3, "nested": [{"k": "***"}]}
    assert scrub_strings(data) == expected


@pytest.mark.parametrize(
    "name",
    ["GPU_AUTOSCALER_TOKEN", "HA_JOURNAL_DSN", "PROM_TOKEN", "A100_TOKEN", "_X", "inbox_token"],
)
def test_variable_names_look_like_names(name: str) -> None:
    assert looks_like_variable_name(name)


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://ctl:hunter2@db/j",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "s3cr3t-inbox-token",
        "hunter2Pass",
        "9LIVES",
        "A" * 129,
        "",
        "MY_VAR ",
    ],
)
def test_a_secret_pasted_for_a_name_is_refused_without_being_echoed(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError) as caught:
        read_secret_env(value, "c.yaml", "inbox.token_env")
    message = str(caught.value)
    assert message.startswith("c.yaml: inbox.token_env: expects the NAME of an environment")
    assert "\n" not in message
    if value.strip():
        assert value.strip() not in message
    if len(value) >= 4:
        assert value in SECRETS, "refused, and scrubbed should it be printed elsewhere"


def test_reading_a_variable_registers_its_value_and_the_password_inside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SECRETS_TEST_DSN", "postgresql://ctl:pw%40word-x1@db:5432/j")
    monkeypatch.setenv("SECRETS_TEST_KV_DSN", "host=db password='kv pass-x2' dbname=j")
    assert read_secret_env("SECRETS_TEST_DSN", "c.yaml").startswith("postgresql://")
    read_secret_env("SECRETS_TEST_KV_DSN", "c.yaml")
    for value in ("pw%40word-x1", "pw@word-x1", "kv pass-x2"):
        assert value in SECRETS
    assert read_secret_env("SECRETS_TEST_UNSET", "c.yaml") == ""


def test_every_env_field_of_a_config_is_checked_and_its_value_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SECRETS_TEST_PROM", "prom-token-value-x3")
    config = {
        "sources": [{"kind": "prometheus", "settings": {"bearer_token_env": "SECRETS_TEST_PROM"}}],
        "journal": {"postgres_dsn_env": None},
    }
    register_config_secrets(config, "c.yaml")
    assert "prom-token-value-x3" in SECRETS
    config["sources"][0]["settings"]["bearer_token_env"] = "prom-token-pasted-x4"  # type: ignore[index]
    with pytest.raises(InputError, match=r"sources\[0\]\.settings\.bearer_token_env") as caught:
        register_config_secrets(config, "c.yaml")
    assert "prom-token-pasted-x4" not in str(caught.value)
