"""Measurement: providers, the sweep runner, presets, the ablation ladder and the tuning driver."""
