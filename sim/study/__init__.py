"""Studies that run the simulator many times to answer one question: fitting to measurements."""
