"""Multi-turn rollouts, engine-agnostic: the episode loop (episodes.py), the template's turn
delimiters (template.py), tensors and metrics (assemble.py), the per-worker setup (multi_turn.py)."""
