"""Runs of a real model: the executor, calibration on the device at hand, validation and quality."""
