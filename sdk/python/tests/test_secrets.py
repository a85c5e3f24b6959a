"""`secrets` at create, sync and async, against a daemon of its own that maps the test-only names
`api.test` and `other.test` to 127.0.0.1, where the test kit's fake registries serve `/echo`
(the request as it arrived, as JSON) over TLS, and that trusts their test CA upstream. Inside
the sandbox the secret's variable holds a placeholder; curl sends it (trusting
`/run/sandcell/ca.pem`, the CA of the proxy that terminates the sandbox's TLS) and the server
sees the value, in a Bearer header, the query and Basic auth; to a host the secret does not
name it is refused. Bad secrets are refused by the daemon (400) or before anything is sent,
and no message shows a value."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from sandcell import AsyncSandbox, InvalidArgumentError, Sandbox, Secret

from .conftest import Daemon, FakeRegistries, fake_registries, serve

CURL = "curl -sS --cacert /run/sandcell/ca.pem"


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeRegistries]:
    with fake_registries(tmp_path_factory.mktemp("registries"), "api.test", "other.test") as r:
        yield r


@pytest.fixture(scope="module")
def secrets_daemon(tmp_path_factory: pytest.TempPathFactory, registries: FakeRegistries) -> Iterator[Daemon]:
    """A daemon of its own (the name mapping is test-only: it takes SANDCELL_TEST=1, and the
    session's daemon is left as users run it), whose proxy trusts the registries' test CA to
    verify them upstream."""
    env = {"SANDCELL_TEST": "1", "SANDCELL_TEST_RESOLVE": "api.test=127.0.0.1;other.test=127.0.0.1"}
    home, allowed = tmp_path_factory.mktemp("secrets-home"), tmp_path_factory.mktemp("secrets-allowed")
    with serve(home, allowed, f"network.upstream_ca_file={registries.ca}", env=env) as d:
        yield d


def _value() -> str:
    """A value no run repeats, so that finding it proves where it came from."""
    return f"s3cr3t-{secrets.token_hex(12)}"


def _client(d: Daemon) -> dict[str, Any]:
    return {"api_url": d.url, "api_key": d.key}


def test_the_value_reaches_only_the_secrets_host(secrets_daemon: Daemon, registries: FakeRegistries) -> None:
    value, port = _value(), registries.https_port
    secret = Secret("TOKEN", value, ["api.test"])
    network = {"allow": ["api.test", "other.test"]}
    with Sandbox.create(network=network, secrets=[secret], ephemeral=True, **_client(secrets_daemon)) as sb:
        assert value not in repr(sb.info)
        env = sb.exec("printenv TOKEN")
        assert env.exit_code == 0, env.stderr
        placeholder = env.stdout.strip()
        assert placeholder != value and placeholder.startswith("SANDCELL_SECRET_"), placeholder

        # To its host: the server sees the value where the placeholder was.
        out = sb.exec(
            f'{CURL} --fail -H "Authorization: Bearer $TOKEN" "https://api.test:{port}/echo?key=$TOKEN"'
        )
        assert out.exit_code == 0, out.stderr
        seen = json.loads(out.stdout)
        assert seen["headers"]["authorization"] == f"Bearer {value}", seen
        assert seen["path"] == f"/echo?key={value}", seen
        # Basic auth: decoded, replaced, encoded again.
        out = sb.exec(f'{CURL} --fail -u "me:$TOKEN" "https://api.test:{port}/echo"')
        assert out.exit_code == 0, out.stderr
        basic = base64.b64encode(f"me:{value}".encode()).decode()
        assert json.loads(out.stdout)["headers"]["authorization"] == f"Basic {basic}"

        # To a host the secret does not name: refused (403, naming the secret, not its value).
        out = sb.exec(
            f"{CURL} -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $TOKEN\" "
            f'"https://other.test:{port}/echo" 2>&1'
        )
        assert value not in out.stdout
        assert "403" in out.stdout or "TOKEN" in out.stdout, out.stdout
        # Without the placeholder that host is reachable (so the refusal was the secret's).
        out = sb.exec(f"{CURL} -o /dev/null -w '%{{http_code}}' \"https://other.test:{port}/echo\"")
        assert out.stdout == "200", out.stderr


def test_bad_secrets_are_refused_naming_no_value(secrets_daemon: Daemon) -> None:
    client = _client(secrets_daemon)
    value = _value()
    before = len(Sandbox.list(**client))
    refused: list[tuple[dict[str, Any], Any]] = [
        ({"name": "lower", "value": value, "hosts": ["api.test"]}, ["api.test"]),
        ({"name": "A", "value": value, "hosts": []}, ["api.test"]),
        ({"name": "A", "value": value, "hosts": ["http://api.test/"]}, ["api.test"]),
        # The placeholders are the egress proxy's to replace, which `off` has none of.
        ({"name": "A", "value": value, "hosts": ["api.test"]}, "off"),
    ]
    for secret, network in refused:
        with pytest.raises(InvalidArgumentError) as e:
            Sandbox.create(network=network, secrets=[secret], ephemeral=True, **client)
        assert e.value.status == 400 and e.value.code == "invalid_argument", secret["name"]
        assert value not in str(e.value) and value not in repr(e.value)

    # Malformed, before anything is sent.
    with pytest.raises(TypeError, match="hosts is a list of host rules"):
        Sandbox.create(
            secrets=[{"name": "A", "value": value, "hosts": "api.test"}], ephemeral=True, **client
        )
    with pytest.raises(ValueError, match="unknown: 'host'") as v:
        Sandbox.create(
            secrets=[{"name": "A", "value": value, "host": ["api.test"]}], ephemeral=True, **client
        )
    assert value not in str(v.value)
    assert len(Sandbox.list(**client)) == before


def test_a_secrets_repr_hides_its_value() -> None:
    value = _value()
    secret = Secret("TOKEN", value, ["api.test"])
    assert value not in repr(secret) and value not in str(secret), repr(secret)
    assert repr(secret) == "Secret(name='TOKEN', hosts=('api.test',))"


async def test_async_secrets(secrets_daemon: Daemon, registries: FakeRegistries) -> None:
    value, port = _value(), registries.https_port
    # A plain mapping this time, its host a rule with a port.
    secret = {"name": "TOKEN", "value": value, "hosts": [f"api.test:{port}"]}
    async with await AsyncSandbox.create(
        network=["api.test"], secrets=[secret], ephemeral=True, **_client(secrets_daemon)
    ) as sb:
        env = await sb.exec("printenv TOKEN")
        assert env.stdout.startswith("SANDCELL_SECRET_") and value not in env.stdout, env.stdout
        out = await sb.exec(f'{CURL} --fail -H "X-Api-Key: $TOKEN" "https://api.test:{port}/echo"')
        assert out.exit_code == 0, out.stderr
        assert json.loads(out.stdout)["headers"]["x-api-key"] == value
    with pytest.raises(InvalidArgumentError):
        await AsyncSandbox.create(
            network="off",
            secrets=[Secret("A", value, ["api.test"])],
            ephemeral=True,
            **_client(secrets_daemon),
        )


def test_secrets_are_rotated_live_and_given_to_forks(secrets_daemon: Daemon, registries: FakeRegistries) -> None:
    first, rotated, forked, port = _value(), _value(), _value(), registries.https_port
    client = _client(secrets_daemon)

    def sent(sb: Sandbox) -> str:
        out = sb.exec(f'{CURL} --fail "https://api.test:{port}/echo?key=$TOKEN"')
        assert out.exit_code == 0, out.stderr
        return str(json.loads(out.stdout)["path"])

    with Sandbox.create(network=["api.test"], secrets=[Secret("TOKEN", first, ["api.test"])], **client) as sb:
        [state] = sb.secrets()
        assert state.name == "TOKEN" and state.held and state.hosts == ["api.test"], state
        assert first not in repr(state)
        # Rotated: the same placeholder, the new value.
        [again] = sb.set_secrets([Secret("TOKEN", rotated, ["api.test"])])
        assert again.placeholder == state.placeholder, (again, state)
        assert sent(sb) == f"/echo?key={rotated}"
        with pytest.raises(InvalidArgumentError) as bad:
            sb.set_secrets([{"name": "TOKEN", "value": "a\nb", "hosts": ["api.test"]}])
        assert "TOKEN" in str(bad.value) and "a\nb" not in str(bad.value)
        assert sent(sb) == f"/echo?key={rotated}", "a refused change changes nothing"

        snap = sb.create_snapshot()
        # A fork gets the value its origin had, or the one given.
        [inherited] = Sandbox.fork(snap.id, ephemeral=True, **client)
        [given] = Sandbox.fork(snap.id, ephemeral=True, secrets=[Secret("TOKEN", forked, ["api.test"])], **client)
        with inherited, given:
            assert sent(inherited) == f"/echo?key={rotated}"
            assert sent(given) == f"/echo?key={forked}"
        with pytest.raises(InvalidArgumentError, match="NOPE"):
            Sandbox.fork(snap.id, secrets=[Secret("NOPE", forked, ["api.test"])], **client)
