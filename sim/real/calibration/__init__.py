"""``simctl calibrate``: micro-benchmarks with torch on the device at hand, least-squares fits,
and a hardware + runtime profile YAML with provenance that scenarios accept
(``hardware: profile.yaml``, ``runtime: profile.yaml``).

:mod:`.timing` (clocks and fits), :mod:`.bench` (the benchmarks), :mod:`.profile` (running them
for a model shape and writing the profile). torch is imported only inside these modules.
"""
