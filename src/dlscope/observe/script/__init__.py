"""Import paths of earlier releases, kept working by re-export: see dlscope.observe."""
