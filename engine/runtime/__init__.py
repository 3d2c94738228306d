"""The runtime: one launcher, a coordinator and worker ranks that take rollout and trainer roles.

What lives here: `launch` (spawn ranks, forward signals, tear down), `run` (placement, the run
end to end, the summary), `coordinator` (the step core's commands as messages), `worker` (a
rank's roles), `protocol` and `control` (messages and the store mailbox), `groups` (process
groups rebuilt per role map), `weights` (versioned trainer -> rollout sync), `checkpoint`,
`view` (the live view), `preflight` (start-up checks), `profile` (measuring this machine's cost
profile: `python -m engine.runtime.profile`), `profile_cache` (that profile, measured once and
cached), `once` (an env call re-issued after a move runs once), `export`, `devcheck`, `forkserver_signals`.

May import: engine, engine.rollout, engine.trainer, steps, envs, envs.sandbox, scheduler, runlog,
loggers, config
Must not import: sim, bench (the runtime never shells out to a benchmark either).
"""
