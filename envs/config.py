"""`EnvConfig`: the sandbox knobs a user sets for every bench (`--env.*` flags); `SandboxConfig`, `SandboxResult`.

Each env constructor takes it as `env_cfg=` (through `envs.registry.make_env(..., env_cfg=...)`)
and turns it into its own `envs.sandbox.sandbox.SandboxConfig` with `SandboxConfig.from_env`, adding its
per-bench timeouts. What each limit becomes depends on the machine (see envs/sandbox/sandbox.py):
with cgroups (v2, or v1 controllers we may write) memory, processes and CPU are per call, all
processes and the private /tmp together; without them only the per-process rlimits remain.

`SandboxConfig` is what one `envs.sandbox.sandbox.Sandbox` runs with (a bench's settings under the
user's); `SandboxResult` is what one call returns. The data dirs a policy must not read are the
bench's to name: it adds them with `SandboxConfig.hiding` (envs/swe/env.py: its projects and task
index); the sandbox names none. Torch-free, like all of envs/.

Invariants (tests/envs/sandbox/test_sandbox.py::test_env_config_errors, test_config_errors): every bad value
raises ValueError with the value, the constraint and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

ISOLATIONS = ("auto", "namespaces", "rlimits")


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    isolation: str = "auto"  # "auto"/"namespaces": user+PID+net+mount namespaces, else fail; "rlimits": explicit weak fallback
    memory_mb: int | None = None  # memory of one call (all its processes + private /tmp); None = the bench's default
    max_procs: int = 64  # processes (and threads) one call may run at once
    cpu_cores: float = 1.0  # CPU time one call may use per wall second (cgroup quota)
    tmpfs_mb: int = 128  # size of the private /tmp (also /var/tmp, /dev/shm) of one call
    workdir_mb: int = 64  # size cap of an episode's work dir (a size-limited tmpfs when we are root)
    workdir_inodes: int = 8192  # files + dirs cap of an episode's work dir
    root_dir: str = ""  # where work dirs live; "" = the system temp dir

    def __post_init__(self):
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"EnvConfig.isolation={self.isolation!r} must be one of {', '.join(ISOLATIONS)}; "
                             "use 'rlimits' only where namespaces do not work (it lacks network and filesystem isolation).")
        if self.memory_mb is not None and self.memory_mb < 64:
            raise ValueError(f"EnvConfig.memory_mb={self.memory_mb} must be >= 64 (a Python interpreter needs ~30 MB); raise it or pass None.")
        for name in ("max_procs", "tmpfs_mb", "workdir_mb", "workdir_inodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"EnvConfig.{name}={getattr(self, name)} must be >= 1; pass a positive value.")
        if not 0.01 <= self.cpu_cores <= 1024:
            raise ValueError(f"EnvConfig.cpu_cores={self.cpu_cores} must be in [0.01, 1024]; e.g. 1.0 for one core per call.")
        if self.root_dir and not self.root_dir.startswith("/"):
            raise ValueError(f"EnvConfig.root_dir={self.root_dir!r} must be an absolute path or ''; write it starting with '/'.")


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    timeout_s: float = 10.0  # default wall-clock limit of one command
    cpu_s: int = 10  # RLIMIT_CPU of the command (CPU seconds, all threads)
    memory_mb: int = 1024  # per call (cgroup: all processes + private /tmp) and per process (RLIMIT_AS)
    max_procs: int = 64  # per call (cgroup pids) and RLIMIT_NPROC (threads count too)
    cpu_cores: float = 1.0  # CPU one call may use per wall second (cgroup CPU quota)
    max_file_mb: int = 64  # RLIMIT_FSIZE: largest file one write may grow
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_output_bytes: int = 65536  # stdout and stderr are each cut to this many bytes
    max_concurrent: int = 8  # commands running at once across threads
    tmpfs_mb: int = 128  # size of the private /tmp (shared with /var/tmp, /dev/shm) inside the sandbox
    workdir_mb: int = 64  # size cap of a work dir (tmpfs when root; else checked after each call)
    workdir_inodes: int = 8192  # files + dirs cap of a work dir
    root_dir: str = ""  # parent of work dirs; "" = the system temp dir
    hidden_paths: tuple[str, ...] = ()  # data dirs a policy must not read (the bench's: `hiding`), covered where a bound dir holds them
    expose_paths: tuple[str, ...] = ()  # extra dirs bound read-only inside (the interpreter's are added)
    isolation: str = "auto"  # "auto"/"namespaces" (else RuntimeError) | "rlimits" (explicit weak fallback)
    uid: int | None = None  # uid to run as; None = 65534 when root, else our own
    use_cgroup: bool = True  # per-call cgroups where we may create them; False = rlimits only (tests the fallback)

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_procs", "cpu_cores", "max_file_mb", "max_open_files",
                     "max_output_bytes", "max_concurrent", "tmpfs_mb", "workdir_mb", "workdir_inodes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name}={getattr(self, name)} must be > 0; pass a positive value.")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxConfig.memory_mb={self.memory_mb} must be >= 64 (a Python interpreter needs ~30 MB of address space); raise it.")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"SandboxConfig.isolation={self.isolation!r} must be 'auto', 'namespaces' or 'rlimits'; pick one.")
        for p in self.hidden_paths + self.expose_paths:
            if not p.startswith("/"):
                raise ValueError(f"SandboxConfig.hidden_paths/expose_paths entry {p!r} must be an absolute path; write it starting with '/'.")

    def hiding(self, dirs: tuple[str, ...] | list[str]) -> SandboxConfig:
        """This config with a bench's data dirs (what its policy must not read) added to `hidden_paths`, each once."""
        return replace(self, hidden_paths=(*self.hidden_paths, *(d for d in dirs if d not in self.hidden_paths)))

    @classmethod
    def from_env(cls, env: EnvConfig | None, **bench) -> SandboxConfig:
        """A bench's sandbox config: its own settings (`bench`, e.g. timeouts) under the user's EnvConfig."""
        if env is None:
            return cls(**bench)
        user = {f.name: getattr(env, f.name) for f in fields(env)}
        if user["memory_mb"] is None:
            del user["memory_mb"]  # the bench's default
        return cls(**{**bench, **user})


@dataclass(frozen=True, kw_only=True)
class SandboxResult:
    returncode: int  # -N when killed by signal N
    stdout: str
    stderr: str
    status: str  # "success" (rc 0) | "failure" | "timeout"
    latency_s: float
    truncated: bool = False  # stdout or stderr was cut to max_output_bytes
    info: dict = field(default_factory=dict)  # isolation, and cgroup stats (memory_peak_bytes, oom_kills, cpu_throttled_periods)

    @property
    def output(self) -> str:
        """stdout and stderr together, as a model usually sees them."""
        return self.stdout + (("\n" if self.stdout and not self.stdout.endswith("\n") else "") + self.stderr if self.stderr else "")
