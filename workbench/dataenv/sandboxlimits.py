"""The limits of one sandboxed execution (`SandboxLimits`, SQL and Python alike) and how
cut output is marked."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from workbench.records import StrictModel

TRUNCATION_MARKER = "...[truncated: {n} more characters]"


class SandboxLimits(StrictModel):
    """Limits for one execution. The defaults suit an agent exploring a small database."""

    model_config = ConfigDict(frozen=True)

    sql_timeout_s: float = Field(5.0, gt=0, description="SQL deadline (progress handler).")
    sql_max_value_bytes: int = Field(1_000_000, ge=1000, description=(
        "Largest string or blob a statement may make (SQLITE_LIMIT_LENGTH): it bounds the "
        "memory and the time of one function call, which the deadline cannot interrupt."))
    sql_cache_mb: int = Field(32, ge=1, description="Page cache of a statement; sorts and "
                                                    "materialised rows beyond it spill to "
                                                    "temp files.")
    sql_max_rows: int = Field(200, ge=1, description="Rows returned; more sets `truncated`.")
    sql_max_cell_chars: int = Field(2000, ge=16, description="Longer text values are cut.")
    py_timeout_s: float = Field(20.0, gt=0, description="Wall clock, from process start.")
    py_cpu_s: int = Field(20, ge=1, description="RLIMIT_CPU (seconds of CPU).")
    py_memory_mb: int = Field(1024, ge=384, description="RLIMIT_AS (the interpreter with "
                                                        "pandas takes ~330 MB of it).")
    py_max_procs: int = Field(16, ge=1, description="RLIMIT_NPROC above the sandbox user's "
                                                    "current count (processes + threads).")
    py_max_file_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file written.")
    py_max_open_files: int = Field(256, ge=32, description="RLIMIT_NOFILE.")
    py_max_disk_mb: int = Field(256, ge=1, description="Disk the working folder may use; "
                                "measured every 0.1 s, the code is stopped past it.")
    py_max_disk_files: int = Field(10_000, ge=1, description="Files and folders in it.")
    output_cap_chars: int = Field(65_536, ge=256, description="Captured print output.")
    result_cap_chars: int = Field(65_536, ge=256, description="The JSON of `result`.")
