"""`workbench app` stops within 10 s on SIGTERM or SIGINT and leaves no Streamlit server
behind (it used to orphan the server, which kept the port)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, free_port, wait_http


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_app_stops_with_its_children(tmp_path, sig, server_process):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "app", "--workspace",
                             str(tmp_path / "ws"), "--port", str(port)], cwd=REPO,
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", timeout=60, proc=proc)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert children  # the Streamlit server the CLI started (in its own process group)
        proc.send_signal(sig)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        streamlit_group = [int(p) for p in children]
        while time.monotonic() < deadline and any(_group_alive(p) for p in streamlit_group):
            time.sleep(0.1)
        assert not any(_group_alive(p) for p in streamlit_group), "Streamlit left running"
        import socket

        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # the port is free again
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
