"""llama.cpp's own server inside this process (the `xllamacpp` binding), as the llamacpp
backend runs it: bound to 127.0.0.1 on a port the OS picks, locked by a random key that never
leaves the process, one KV cache per parallel slot. And whether the engine is installed and
can use this machine (`available`, `gpu_build`, `fallback_reason`), which the backend
registry asks before it picks llama.cpp for a GGUF file."""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
from pathlib import Path

from workbench import openmp
from workbench.errors import BackendError

log = logging.getLogger(__name__)

PACKAGE = "xllamacpp"
PIP = "pip install 'xllamacpp==2026.10.11549'"


def available() -> bool:
    """Whether the llama.cpp engine is installed (nothing is imported)."""
    return importlib.util.find_spec(PACKAGE) is not None


def _nvidia_gpu() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")


def gpu_build() -> bool:
    """Whether the installed xllamacpp can offload to a GPU."""
    import xllamacpp

    try:
        return any("GPU" in str(d.get("type")) for d in xllamacpp.get_device_info())
    except Exception:  # noqa: BLE001 - a binding without device info: treat as CPU-only
        return False


def fallback_reason() -> str | None:
    """Why a GGUF model's generation cannot go to llama.cpp here (None: it can): the engine
    is not installed, or this machine has an NVIDIA GPU that the installed (CPU) build of
    the engine cannot use while transformers can."""
    if not available():
        return f"the llama.cpp engine is not installed (`{PIP}`)"
    if _nvidia_gpu() and not gpu_build():
        return ("this machine has an NVIDIA GPU and the installed llama.cpp engine is a CPU "
                "build (install xllamacpp's CUDA wheel to generate there from GGUF files)")
    return None


_SPIN_SAID = False


def _say_if_spinning(threads: int) -> None:
    """Warn once when llama.cpp's OpenMP threads in this process spin-wait at barriers
    (libgomp was loaded before `import workbench` could bound their spinning: `workbench.openmp`)."""
    global _SPIN_SAID
    if threads > 1 and openmp.state() == "late" and not _SPIN_SAID:
        _SPIN_SAID = True
        log.warning("OpenMP was loaded before the workbench (torch imported first?), so "
                    "llama.cpp's threads spin-wait, and generation slows many-fold when "
                    "another process uses the CPU; set GOMP_SPINCOUNT=1000 in the "
                    "environment, or import workbench first")


class Server:
    """llama.cpp's server in this process: 127.0.0.1, a port the OS picks, a random key."""

    def __init__(self, gguf: Path, *, slots: int, context: int, threads: int,
                 gpu_layers: int, lora: Path | None, lora_scale: float, timeout_s: float,
                 prompt_cache_mib: int = 0, poll: int = 50):
        import httpx
        import xllamacpp as xlc

        _say_if_spinning(threads)
        p = xlc.CommonParams()
        p.model.path = str(gguf)
        p.n_parallel = slots
        p.n_ctx = context * slots
        # a cache per slot: in one shared cache a reply's rounding depended on the other
        # requests in flight (the same seeded batch twice: 2 of 12 replies alike; per slot,
        # 12 of 12, and each the same as when it ran alone)
        p.kv_unified = False
        p.ctx_shift = False  # a prompt that does not fit is refused, never silently cut
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        # polling for work between graphs; the wheel's ggml is built with OpenMP, whose
        # barriers wait by OpenMP's own policy (`workbench.openmp`), so it has no effect there
        p.cpuparams.poll = p.cpuparams_batch.poll = poll
        p.n_gpu_layers = gpu_layers
        p.fit_params = False  # the sizes asked for, not ones fitted to free memory
        p.cache_ram_mib = prompt_cache_mib  # 0: no prompt cache beyond the slots' own
        p.verbosity = -1
        p.ui = False
        # /slots (behind the key, like every route but /health): how many tokens the busy
        # slots have made so far, a progress line's figure while a batch of replies runs
        p.endpoint_slots = True
        p.hostnames = ["127.0.0.1"]
        p.port = 0
        self.key = secrets.token_urlsafe(24)
        p.api_keys = [self.key]
        if lora is not None:
            p.lora_adapters = [xlc.CommonAdapterLoraInfo(str(lora), float(lora_scale))]
        self.params = p
        try:
            self.server = xlc.Server(p)
        except Exception as e:
            raise BackendError(f"llama.cpp could not load {gguf.name}: {e}") from e
        self.url = self.server.listening_address.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.key}"},
            timeout=httpx.Timeout(30.0, read=timeout_s), trust_env=False,
            limits=httpx.Limits(max_connections=slots + 4, max_keepalive_connections=slots + 4))
        meta = self.http.get("/v1/models").json()["data"][0].get("meta") or {}
        self.n_ctx_train = int(meta.get("n_ctx_train") or 0) or None

    def decoding(self) -> int | None:
        """The tokens the slots busy now have generated so far (llama.cpp's `/slots`), for
        a progress figure; None when the server cannot say within 2 s."""
        import httpx

        try:
            r = self.http.get("/slots", timeout=2.0)
            if r.status_code != 200:
                return None
            n = 0
            for slot in r.json():
                if isinstance(slot, dict) and slot.get("is_processing"):
                    nt = slot.get("next_token") or {}
                    nt = nt[0] if isinstance(nt, list) and nt else nt
                    n += int(nt.get("n_decoded") or 0) if isinstance(nt, dict) else 0
            return n
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            return None

    def close(self) -> None:
        self.http.close()
        server, self.server = getattr(self, "server", None), None
        del server  # the binding stops the server's threads when the object goes
