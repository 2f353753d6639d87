"""Steps: each measures one thing and returns its section (the registry: dlscope.steps.registry)."""
