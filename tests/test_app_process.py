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
                                  text=True, check=False).stdout.split()
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


def test_streamlit_run_of_the_checkout_entry_serves_the_app_with_its_settings(tmp_path,
                                                                              server_process):
    """`streamlit run apps/streamlit/app.py`, as a Streamlit user starts an app from a
    checkout, serves the packaged app with the package's security settings (read from the
    entry's own .streamlit folder, wherever it is started from): XSRF on, uploads capped at
    20 MB where Streamlit's default is 200."""
    import httpx

    port = free_port()
    away = tmp_path / "elsewhere"
    away.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run",
                             str(REPO / "apps" / "streamlit" / "app.py"), "--server.port",
                             str(port)], cwd=away, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, TQDM_DISABLE="1"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/_stcore/health", timeout=60, proc=proc)
        r = httpx.put(f"{url}/_stcore/upload_file/x/y", files={"file": ("a.md", b"x")},
                      timeout=10)
        assert r.status_code == 403  # no XSRF token
        try:
            r = httpx.put(f"{url}/_stcore/upload_file/x/y", content=b"x" * (21 * 2**20),
                          headers={"Content-Type": "application/octet-stream"}, timeout=30)
            assert r.status_code in (403, 413)
        except httpx.HTTPError:
            pass  # the server may close the connection instead of answering
        import socket

        with socket.socket() as s:  # bound to the loopback only, as the settings say
            s.settimeout(2)
            outside = socket.gethostbyname(socket.gethostname())
            if not outside.startswith("127."):
                assert s.connect_ex((outside, port)) != 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
