"""Measurement: providers, the sweep runner, the presets (`sweeps/*.toml`), the ablation ladder,
the tuning driver, the measurements of `gate --run`, and the commands' spec objects (`spec`)."""
