"""The registry's table of built-in policy modules: every name it lists is registered by the
class of that module, and every built-in policy is listed, so that looking one name up can
import only its module."""

from __future__ import annotations

import ast
import subprocess
import sys

from moesim.policies.contract import registry


def test_table_matches_the_registered_classes() -> None:
    registry.load_builtin_policies()
    builtin = {name: cls.__module__ for name, cls in registry._REGISTRY.items()
               if cls.__module__.startswith("moesim.policies.")}
    assert builtin == registry._MODULE_OF


def test_one_lookup_imports_only_its_module() -> None:
    """A fresh interpreter that looks up ``lru`` imports the caching module and no other
    policy module; an unknown name still gets a suggestion from every policy."""
    code = ("import sys; from moesim.policies.contract.registry import policy_class, PolicyError\n"
            "policy_class('lru')\n"
            "print(sorted(m for m in sys.modules if m.startswith('moesim.policies.') and m.count('.') == 3))\n"
            "try:\n    policy_class('mixtral-offloadin')\nexcept PolicyError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    loaded = ast.literal_eval(out[0])   # a list literal printed by the child
    assert "moesim.policies.baselines.caching" in loaded
    papers = {"fmoe", "buddymoe", "moepic", "commitmoe", "activeevict"}
    assert not {m for m in loaded if m.split(".")[2] in papers}
    assert not {m for m in loaded if m.startswith("moesim.policies.baselines.") and not m.endswith(".caching")}
    assert "did you mean 'mixtral-offloading'" in out[1]
