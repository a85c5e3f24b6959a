"""`packages` at create, sync and async, against a daemon of its own pointed at the test kit's
fake package registries: the daemon maps the test-only names `pypi.test` and `npm.test` to
127.0.0.1, and installs from `https://pypi.test:P/simple/` and `https://npm.test:P/` (trusting
the registries' test CA). The first create installs `sandcell-fake` (pip, and npm when the host
has npm) inside the sandbox; the next with the same lists gets it from the cache; both can
import it. A package the index lacks and packages with network `off` are refused, naming the
package, and leave no sandbox."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator

import pytest

from sandcell import (
    AsyncSandbox,
    InvalidArgumentError,
    Packages,
    PackagesReport,
    Sandbox,
)

from .conftest import Daemon, FakeRegistries, fake_registries, serve

# The npm half needs npm on the host (the sandbox runs the host's): Debian's nodejs has none.
NPM = shutil.which("npm") is not None and shutil.which("node") is not None
PYTHON_CHECK = "python3 -c 'import sandcell_fake; print(sandcell_fake.VALUE)'"
NODE_CHECK = "cd /workspace && node -e 'console.log(require(\"sandcell-fake\"))'"


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeRegistries]:
    with fake_registries(tmp_path_factory.mktemp("registries"), "pypi.test", "npm.test") as r:
        yield r


@pytest.fixture(scope="module")
def pkg_daemon(tmp_path_factory: pytest.TempPathFactory, registries: FakeRegistries) -> Iterator[Daemon]:
    """A daemon of its own installing from the fake registries (the name mapping is test-only:
    it takes SANDCELL_TEST=1, and the session's daemon is left as users run it)."""
    port = registries.https_port
    settings = (
        f"packages.pip_index_url=https://pypi.test:{port}/simple/",
        f"packages.npm_registry=https://npm.test:{port}/",
        f"packages.ca_file={registries.ca}",
        # Python sandboxes with the package installed while they wait (the tests above use
        # the default template, which this pool never serves).
        "pools.warm=python/small=1 pip:sandcell-fake",
    )
    env = {"SANDCELL_TEST": "1", "SANDCELL_TEST_RESOLVE": "pypi.test=127.0.0.1;npm.test=127.0.0.1"}
    home, allowed = tmp_path_factory.mktemp("pkg-home"), tmp_path_factory.mktemp("pkg-allowed")
    with serve(home, allowed, *settings, env=env) as d:
        yield d


def _check(sb: Sandbox, npm: bool) -> None:
    """The installed packages work inside the sandbox."""
    out = sb.exec(PYTHON_CHECK)
    assert out.stdout == "42\n", out.stderr
    if npm:
        out = sb.exec(NODE_CHECK)
        assert out.stdout == "42\n", out.stderr


def _active(d: Daemon) -> int:
    return len(Sandbox.list(api_url=d.url, api_key=d.key))


def test_packages_are_installed_at_create_then_come_from_the_cache(pkg_daemon: Daemon) -> None:
    packages: Packages = {"pip": ["sandcell-fake"]}
    if NPM:
        packages["npm"] = ["sandcell-fake"]
    else:
        warnings.warn("skipped: npm is not installed here (the npm half of the packages test)", stacklevel=1)
    client = {"api_url": pkg_daemon.url, "api_key": pkg_daemon.key}
    with Sandbox.create(packages=packages, ephemeral=True, **client) as sb:
        first = sb.info.packages
        assert isinstance(first, PackagesReport), sb.info
        assert first.cached is False
        assert first.files > 0 and first.bytes > 0 and first.duration_ms >= 0, first
        _check(sb, NPM)
        # The install's access is gone: the sandbox's own policy (loopback) is back.
        assert sb.info.network == "loopback"
        # The report belongs to the create answer: the record read again has none.
        assert sb.refresh().packages is None

    # The same lists again (in another order of keys): from the cache.
    again: Packages = {"npm": ["sandcell-fake"], "pip": ["sandcell-fake"]} if NPM else {"pip": ["sandcell-fake"]}
    with Sandbox.create(packages=again, ephemeral=True, **client) as sb:
        cached = sb.info.packages
        assert cached is not None and cached.cached is True, cached
        assert cached.files > 0 and cached.bytes > 0, cached
        _check(sb, NPM)

    # Without packages, no report.
    with Sandbox.create(ephemeral=True, **client) as sb:
        assert sb.info.packages is None


def test_a_warm_pool_serves_the_same_packages_installed_ahead(pkg_daemon: Daemon) -> None:
    import time
    import urllib.request

    ready = 'sandcell_pool_ready{pool="python/small+pip:sandcell-fake"} 1'
    deadline = time.monotonic() + 120
    while True:
        req = urllib.request.Request(
            f"{pkg_daemon.url}/metrics", headers={"Authorization": f"Bearer {pkg_daemon.key}"}
        )
        # Straight to the daemon, whatever proxy the environment names.
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as r:
            if ready in r.read().decode():
                break
        assert time.monotonic() < deadline, "the warm pool never filled"
        time.sleep(0.2)
    client = {"api_url": pkg_daemon.url, "api_key": pkg_daemon.key}
    with Sandbox.create(template="python", packages={"pip": ["sandcell-fake"]}, ephemeral=True, **client) as sb:
        report = sb.info.packages
        assert isinstance(report, PackagesReport) and report.from_pool is True, report
        assert report.files > 0, report
        out = sb.exec(PYTHON_CHECK)
        assert out.stdout == "42\n", out.stderr


def test_refusals_name_the_package_and_leave_no_sandbox(pkg_daemon: Daemon) -> None:
    client = {"api_url": pkg_daemon.url, "api_key": pkg_daemon.key}
    before = _active(pkg_daemon)
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(packages={"pip": ["no-such-package"]}, ephemeral=True, **client)
    assert e.value.code == "invalid_argument" and e.value.status == 400
    assert "packages.pip (no-such-package)" in e.value.message, e.value.message
    assert _active(pkg_daemon) == before

    # Installed through the egress proxy, which `off` has none of.
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(packages={"pip": ["x"]}, network="off", ephemeral=True, **client)
    assert e.value.code == "invalid_argument" and "off" in e.value.message

    # Only the daemon's installers: another key is refused, not dropped.
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(packages={"apt": ["jq"]}, ephemeral=True, **client)
    assert "apt" in e.value.message

    # A name where a list belongs is caught before anything is sent.
    with pytest.raises(TypeError, match="list of package names"):
        Sandbox.create(packages={"pip": "sandcell-fake"}, ephemeral=True, **client)
    assert _active(pkg_daemon) == before


async def test_async_packages(pkg_daemon: Daemon) -> None:
    # A list of its own (a specifier), so its first install is not served from the cache of
    # the sync test's.
    packages: Packages = {"pip": ("sandcell-fake==1.0",)}
    client = {"api_url": pkg_daemon.url, "api_key": pkg_daemon.key}
    async with await AsyncSandbox.create(packages=packages, ephemeral=True, **client) as sb:
        report = sb.info.packages
        assert isinstance(report, PackagesReport) and report.cached is False, report
        out = await sb.exec(PYTHON_CHECK)
        assert out.stdout == "42\n", out.stderr
    async with await AsyncSandbox.create(packages={"pip": ["sandcell-fake==1.0"]}, ephemeral=True, **client) as sb:
        assert sb.info.packages is not None and sb.info.packages.cached is True
        out = await sb.exec(PYTHON_CHECK)
        assert out.stdout == "42\n", out.stderr
    with pytest.raises(InvalidArgumentError) as e:
        await AsyncSandbox.create(packages={"pip": ["no-such-package"]}, ephemeral=True, **client)
    assert "no-such-package" in e.value.message
    with pytest.raises(InvalidArgumentError):
        await AsyncSandbox.create(packages={"pip": ["x"]}, network="off", ephemeral=True, **client)
