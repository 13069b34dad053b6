"""Integrations with other libraries. Each one is a submodule imported on demand and
activated by a call (``fuseops.integrations.transformers.register()``): importing
fuseops never imports, or changes, another library."""
