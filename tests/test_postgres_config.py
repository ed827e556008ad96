"""PostgreSQL settings that need no server: bad URLs refused by name, and a server that never
answers given up on after connect_timeout even in a gevent worker."""
import socket
import subprocess
import sys
import time

import pytest

from llmgw.db import open_database
from llmgw.errors import ConfigError
from tests.conftest import TOP


def test_a_url_parameter_llmgw_does_not_pass_on_is_refused_by_name():
    with pytest.raises(ConfigError, match="'max_connections'.*Remove it from the URL"):
        open_database("postgresql://llmgw:pw@db.example/llmgw?max_connections=3")


def test_a_url_without_a_database_says_how_to_write_one_and_hides_the_password():
    with pytest.raises(ConfigError) as e:
        open_database("postgresql://llmgw:hunter2@db.example/")
    assert "hunter2" not in str(e.value) and "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in str(e.value)


def test_a_server_that_never_answers_is_given_up_on_in_a_gevent_worker(tmp_path):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshake; nobody ever says a word
    port = silent.getsockname()[1]
    script = f"""
from gevent import monkey; monkey.patch_all()
import time, peewee
from llmgw.db import open_database
db = open_database("postgresql://llmgw@127.0.0.1:{port}/llmgw?connect_timeout=1")
started = time.monotonic()
try:
    db.connect()
except peewee.OperationalError as e:
    print("refused after", round(time.monotonic() - started, 1), e)
"""
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], cwd=TOP, capture_output=True, text=True,
                         timeout=30)
    silent.close()
    assert "refused after" in out.stdout, out.stderr[-2000:]
    assert "connect_timeout" in out.stdout and time.monotonic() - started < 10
