"""`dlscope run`: observe any training script, unchanged (bootstrap hooks, analysis, one timeline)."""
