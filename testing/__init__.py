"""moesim's public conformance kit: :func:`check_policy` checks that a policy class of your own
keeps the contract every shipped policy keeps (its parameters stored, VRAM within the budget,
same seed same output, no read of the future), and :mod:`moesim.testing.fixtures` holds the
small traces, models and hardware it runs on.

    from moesim.testing import check_policy
    check_policy(MyPolicy)   # raises ConformanceError naming the rule and the parameter
"""

from moesim.testing.conformance import Check, ConformanceError, check_policy, policy_checks

__all__ = ["Check", "ConformanceError", "check_policy", "policy_checks"]
