"""A real load balancer for the tests: Debian's nginx on 127.0.0.1, in front of replicas.

`Nginx(upstreams).start()` writes a configuration (the one docs/deploy.md shows, with short
timeouts for the tests) into a temporary directory and runs nginx in the foreground on a free
port; `stop()` ends it by its PID. Without nginx the tests that need it are skipped, naming
the package to install; under `CI=true` they fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from pgserver import free_port, missing

INSTALL_HINT = "nginx not found: apt-get install nginx"

#: The tested configuration's `http` block (docs/deploy.md shows the same, with longer times).
HTTP_BLOCK = """
    upstream synapse_replicas {{
{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location = /lb-health {{ return 204; }}
        location / {{
            proxy_pass http://synapse_replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            # A replica that refuses the connection is skipped; a POST already sent is never
            # sent again by nginx (the sender retries, and the replicas deduplicate).
            proxy_next_upstream error;
            proxy_next_upstream_tries 3;
            proxy_connect_timeout 1s;
            proxy_read_timeout {read_timeout}s;
            client_max_body_size 2m;
        }}
    }}
"""


def find_nginx() -> str | None:
    for candidate in ("/usr/sbin/nginx", shutil.which("nginx")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Nginx:
    def __init__(self, upstreams: list[str], *, read_timeout: float = 5.0) -> None:
        binary = find_nginx()
        if binary is None:
            missing(INSTALL_HINT)
        assert binary is not None
        self.binary = binary
        self.upstreams = upstreams
        self.read_timeout = read_timeout
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="synapse-nginx-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        servers = "\n".join(
            f"        server {hostport} max_fails=1 fail_timeout=2s;" for hostport in self.upstreams
        )
        root = self.root
        user = "user root;\n" if os.geteuid() == 0 else ""
        return (
            f"{user}worker_processes 1;\ndaemon off;\npid {root}/nginx.pid;\n"
            f"error_log {root}/error.log warn;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n    access_log off;\n    client_body_temp_path {root}/body;\n"
            f"    proxy_temp_path {root}/proxy;\n    fastcgi_temp_path {root}/fastcgi;\n"
            f"    uwsgi_temp_path {root}/uwsgi;\n    scgi_temp_path {root}/scgi;\n"
            + HTTP_BLOCK.format(
                servers=servers, port=self.port, read_timeout=int(self.read_timeout)
            )
            + "}\n"
        )

    def start(self) -> None:
        conf = self.root / "nginx.conf"
        conf.write_text(self.config())
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(conf), "-p", str(self.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.root / "stderr").open("wb"),
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited: {(self.root / 'stderr').read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/lb-health", timeout=1) as reply:
                    if reply.status == 204:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)  # polling a port that is not open yet: nothing to wait on
        raise AssertionError("nginx did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGQUIT)  # graceful stop of master and worker
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
