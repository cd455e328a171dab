"""BuddyMoE (Wang et al., PPoPP 2026): buddy-expert substitution."""
