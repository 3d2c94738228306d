"""Examples of Libra plug-ins: `--env examples.guess_env:GuessEnv`, `--reward examples.my_reward:exact_answer`."""
