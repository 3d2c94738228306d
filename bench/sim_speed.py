"""Simulator speed: simulated device-seconds per host second on `scale_1024` (1,024 devices, 100 steps).

`python -m bench.sim_speed [--system libra] [--devices 1024] [--steps 100]`; last line
`sim_device_s_per_wall_s: X`. Goal: the 1,024-device, 100-step run in under 60 s of host time.
"""

from __future__ import annotations

import argparse
import time

from bench.presets import scale_1024
from sim.run import simulate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", default="libra")
    p.add_argument("--devices", type=int, default=1024)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--bench", default="swe")
    args = p.parse_args()
    cfg = scale_1024(args.bench).replace(num_devices=args.devices, steps=args.steps)
    t0, c0 = time.perf_counter(), time.process_time()
    s = simulate(cfg, args.system)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    device_s = s["wall_s"] * cfg.num_devices
    print(f"{'system':<10} {'devices':>8} {'steps':>6} {'trajectories':>12} {'sim s':>10} {'host s':>8} {'cpu s':>7} {'dev-s/host-s':>14}")
    print(f"{args.system:<10} {cfg.num_devices:>8} {cfg.steps:>6} {s['trajectories']:>12} {s['wall_s']:>10.0f} "
          f"{wall:>8.1f} {cpu:>7.1f} {device_s / wall:>14.0f}")
    print(f"sim_device_s_per_wall_s: {device_s / wall:.0f}")


if __name__ == "__main__":
    main()
