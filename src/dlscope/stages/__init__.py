"""The runner's stages: each measures one thing and returns its results.json section (the registry:
dlscope.stages.registry). A stage prints nothing; the runner renders its section."""
