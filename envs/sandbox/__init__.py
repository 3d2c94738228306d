"""The sandbox: isolated, bounded execution of tool commands (threat model: docs/sandbox.md).

What lives here: `sandbox` (the `Sandbox` a bench calls: pre-started chains, run, work dirs,
clean-up), `startup` (what a Sandbox checks when it is built: the isolation the machine gives,
what it lacks, our interpreter inside; `start_up_check` for the launcher), `procs` (the process chains: namespaces, rlimits, kill), `fs` (the mount plan:
what a call sees, read-only or hidden), `access` (the allow-list of paths and sockets), `cgroup`
(memory and pid caps through a delegated cgroup), `guard` (the launcher thread and its
deadlines), `hostfs` (bounded host-side file access that never follows a link).

May import: envs
Must not import: torch, engine, sim, the benches (envs.swe, envs.math): a bench passes its data
folders in (`SandboxConfig.hiding`), the sandbox does not know them.
"""
