"""Redis started the way ops/ starts it, for the tests of the shipped users.

``OpsRedis`` runs ``ops/redis/start-redis.sh`` with ``ops/redis/redis.conf``: the
script starts redis-server and loads the Functions library as the ``installer``
user, so the roles never need ``FUNCTION LOAD``. The harness's arguments
(loopback, a free port, a temporary directory) and the ACL file's real path win
over the configuration file's. The users' passwords are the public examples,
which the script accepts only with ``EXAMPLE_OPT_IN`` (a loopback-only demo):
the harness sets it, and listens on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis

from stepbarrier._protocol.roles import password_hash
from stepbarrier._redis.functions import LIBRARY_NAME
from tests.conftest import ROOT
from tests.redis_harness import RedisServer

OPS = Path(ROOT) / "ops" / "redis"
ACL_FILE = OPS / "users.acl"
REDIS_CONF = OPS / "redis.conf"
LIBRARY_FILE = OPS / "stepbarrier-functions.lua"
START_SCRIPT = OPS / "start-redis.sh"
SECRETS = OPS / "example-secrets"
SHIPPED_USERS = ("chief", "worker", "monitor", "emergency", "installer")
EXAMPLE_OPT_IN = {"STEPBARRIER_EXAMPLE_PASSWORDS": "loopback-only"}
"""The environment in which start-redis.sh accepts the example passwords."""


def example_password(user: str) -> str:
    """The example password of a shipped user, as a client sends it."""
    return (SECRETS / f"{user}.password").read_text().rstrip("\r\n")


PASSWORDS = {user: example_password(user) for user in SHIPPED_USERS}
"""The example passwords of ops/redis/example-secrets, by user."""

HARNESS_USER = "harness"
HARNESS_PASSWORD = "harness-secret-of-the-tests"
HARNESS_LINE = f"user {HARNESS_USER} on #{password_hash(HARNESS_PASSWORD)} ~* &* +@all"
"""An all-powerful user some tests add to their copy of users.acl (never shipped)."""


def acl_with(directory: Path, *lines: str) -> Path:
    """A copy of ops/redis/users.acl in ``directory`` with ``lines`` appended."""
    path = directory / "users.acl"
    path.write_text(ACL_FILE.read_text() + "".join(f"{line}\n" for line in lines))
    return path


class OpsRedis(RedisServer):
    """``ops/redis/start-redis.sh`` running ``ops/redis/redis.conf`` on a free port.

    Args:
        acl_file: The users (ops/redis/users.acl by default).
        installer_password_file: The installer's password file, as the
            container's secret.
        environment: Added to the script's environment (``EXAMPLE_OPT_IN`` by
            default: the example passwords are accepted).
    """

    def __init__(
        self,
        acl_file: Path = ACL_FILE,
        installer_password_file: Path = SECRETS / "installer.password",
        environment: dict[str, str] | None = None,
    ) -> None:
        super().__init__(args=["--aclfile", str(acl_file)])
        self.installer_password_file = installer_password_file
        self.environment = dict(EXAMPLE_OPT_IN if environment is None else environment)

    def command(self) -> list[str]:
        _binary, *args = super().command()
        return [
            "sh",
            str(START_SCRIPT),
            str(REDIS_CONF),
            str(LIBRARY_FILE),
            str(self.installer_password_file),
            *args,
        ]

    def start(self, wait: bool = True) -> OpsRedis:
        # a session of its own: kill() ends the script and its server together
        inherited = {k: v for k, v in os.environ.items() if k != "STEPBARRIER_EXAMPLE_PASSWORDS"}
        self.process = subprocess.Popen(
            self.command(),
            env={**inherited, **self.environment, "REDIS_PORT": str(self.port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Wait until the script has loaded the library (the container's health)."""
        super().wait_ready(timeout)
        deadline = time.monotonic() + timeout
        while not self.library_loaded():
            assert self.process is not None
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"start-redis.sh exited {self.process.returncode}: {err}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"start-redis.sh did not load {LIBRARY_NAME} in {timeout} s")
            time.sleep(0.02)

    def library_loaded(self) -> bool:
        """True once ``LIBRARY_NAME`` is loaded (asked as the installer)."""
        client = self.client(username="installer", password=PASSWORDS["installer"])
        try:
            return bool(client.function_list(library=LIBRARY_NAME))
        except redis.RedisError:
            return False
        finally:
            client.close()

    def as_user(self, user: str, password: str | None = None) -> redis.Redis:
        """A client logged in as ``user`` (a shipped user's example password by default)."""
        return self.client(username=user, password=password or PASSWORDS[user])

    def url_of(self, user: str, password: str | None = None) -> str:
        """The server's URL with ``user``'s credentials."""
        secret = password or PASSWORDS[user]
        return self.url.replace("redis://", f"redis://{user}:{secret}@")

    def kill(self) -> None:
        """SIGKILL to the script and its server, as a crashed container."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
